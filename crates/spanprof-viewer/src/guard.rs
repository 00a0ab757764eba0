//! Who may ask: the viewer's routes answer requests whose `Host` is a loopback name,
//! the address the viewer is bound to, or a name the user allowed, and whose
//! `Origin`, if any, is `http://` and one of those; the rest get 403.
//!
//! A web page in the developer's browser can point a name of its own at 127.0.0.1
//! (DNS rebinding) and then read the viewer's answers as its own site's. Its
//! requests carry that name in `Host` (and its site in `Origin`), so checking them
//! is enough. Ports are not checked: a name of this machine is safe on any port, and
//! a tunnel (`ssh -L 7000:127.0.0.1:6060`) reaches the viewer as `localhost:7000`.
//! No CORS headers are sent, so no other site may read an answer either.

use std::net::{Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Lists the host names the viewer answers without being told: the loopback ones,
/// on any port. [`crate::serve`] and [`crate::ViewerThread`] add the address they
/// bind; [`crate::Viewer::allow_host`] adds more.
pub const DEFAULT_ALLOWED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// Names the user allowed besides [`DEFAULT_ALLOWED_HOSTS`], normalized.
#[derive(Clone, Debug, Default)]
pub(crate) struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// Adds `name` (a host name or IP address; a port, if given, is ignored).
    pub(crate) fn allow(&mut self, name: &str) {
        let name = name.trim();
        let name = if name.parse::<Ipv6Addr>().is_ok() {
            format!("[{name}]")
        } else {
            name.to_owned()
        };
        let name = host_name(&name).unwrap_or_else(|| name.to_ascii_lowercase());
        if !self.names.contains(&name) {
            self.names.push(name);
        }
    }

    /// The names answered by `mount` bound at `bound` (`None`: mounted by the user,
    /// address unknown).
    pub(crate) fn check(&self, mount: Mount, bound: Option<SocketAddr>) -> HostCheck {
        let mut names: Vec<String> = DEFAULT_ALLOWED_HOSTS.map(str::to_owned).into();
        let bound = bound.map(|addr| match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        });
        for name in bound.iter().chain(&self.names) {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        HostCheck(Arc::new(Allowed { names, mount }))
    }
}

/// Which router is checked: it says how to allow a name.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mount {
    /// [`crate::Viewer::router`].
    Viewer,
    /// [`crate::debug_router`] alone.
    ProfileEndpoint,
}

impl Mount {
    fn how_to_allow(self, name: &str) -> String {
        match self {
            Mount::Viewer => format!("Viewer::allow_host(\"{name}\")"),
            Mount::ProfileEndpoint => format!("debug_router_with_hosts(profiler, [\"{name}\"])"),
        }
    }
}

#[derive(Debug)]
struct Allowed {
    names: Vec<String>,
    mount: Mount,
}

/// The state of [`refuse_foreign`]: the names a router answers.
#[derive(Clone, Debug)]
pub(crate) struct HostCheck(Arc<Allowed>);

impl HostCheck {
    fn allows(&self, authority: &str) -> bool {
        host_name(authority).is_some_and(|name| self.0.names.contains(&name))
    }

    /// Passes `headers` (and the request target's authority, if any), or says why
    /// they are refused.
    fn admit(&self, headers: &HeaderMap, target: Option<&str>) -> Result<(), String> {
        let host = single(headers, &header::HOST)?;
        let origin = single(headers, &header::ORIGIN)?;
        // An absolute request target (`GET http://name/… HTTP/1.1`) names the host
        // too; it must be allowed as well.
        for authority in host.iter().chain(target.iter()) {
            if !self.allows(authority) {
                let name = host_name(authority).unwrap_or_else(|| "name".into());
                return Err(format!(
                    "Host {authority:?} is not a name of this viewer ({}); a web page \
                     could point such a name at this machine and read the profiles. \
                     To allow it, call {}.",
                    self.names(),
                    self.0.mount.how_to_allow(&name),
                ));
            }
        }
        let Some(origin) = origin else {
            return Ok(());
        };
        if host.is_none() && target.is_none() {
            return Err(format!(
                "a request with an Origin ({origin:?}) must name its Host"
            ));
        }
        match origin.strip_prefix("http://") {
            Some(authority) if self.allows(authority) => Ok(()),
            _ => Err(format!(
                "Origin {origin:?} is not a page of this viewer (http:// and {}); \
                 to allow a name, call {}.",
                self.names(),
                self.0.mount.how_to_allow("name"),
            )),
        }
    }

    fn names(&self) -> String {
        self.0.names.join(", ")
    }
}

/// The value of header `name`, if sent once; an error if sent twice or not text.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("more than one {name} header"));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| format!("the {name} header is not text"))
}

/// The host of `authority` (`name`, `name:port`, `[v6]`, `[v6]:port`), lowercased,
/// IPv6 addresses written the short way; `None` if it is not one.
fn host_name(authority: &str) -> Option<String> {
    let (name, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let v6: Ipv6Addr = v6.parse().ok()?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (format!("[{v6}]"), port)
    } else {
        let (name, port) = match authority.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        };
        let name_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
        if name.is_empty() || !name.chars().all(name_chars) {
            return None;
        }
        (name.to_ascii_lowercase(), port)
    };
    if let Some(port) = port
        && (port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    Some(name)
}

/// Answers 403, with why, for a request addressed to a name the router does not
/// answer; passes the rest on. Sends no CORS headers.
pub(crate) async fn refuse_foreign(
    State(check): State<HostCheck>,
    request: Request,
    next: Next,
) -> Response {
    let target = request.uri().authority().map(|a| a.as_str());
    match check.admit(request.headers(), target) {
        Ok(()) => next.run(request).await,
        Err(why) => (StatusCode::FORBIDDEN, format!("refused: {why}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_names_are_read_strictly() {
        for (authority, name) in [
            ("localhost", Some("localhost")),
            ("LocalHost:6060", Some("localhost")),
            ("127.0.0.1:0", Some("127.0.0.1")),
            ("[::1]:6060", Some("[::1]")),
            ("[0:0:0:0:0:0:0:1]", Some("[::1]")),
            ("127.0.0.1.nip.io:6060", Some("127.0.0.1.nip.io")),
            ("localhost:", None),
            ("localhost:60a", None),
            ("localhost:1:2", None),
            ("user@localhost", None),
            ("[::1", None),
            ("[::1]x", None),
            ("", None),
        ] {
            assert_eq!(host_name(authority).as_deref(), name, "{authority:?}");
        }
    }
}
