//! Query strings read strictly: a parameter the route does not know, one given
//! twice, a value it cannot read or malformed percent-encoding is answered 400 at
//! once, naming the parameter, before the route does anything (a mistyped
//! `/debug/spanprof/profile?SECONDS=2` would otherwise start the default 30 s capture).

use std::fmt;
use std::str::FromStr;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

/// A route's query, read from its [`Params`].
pub(crate) trait FromQuery: Sized {
    /// The parameters the route knows.
    const KNOWN: &'static [&'static str];

    /// Reads the query; `params` holds known parameters only, each once.
    fn from_query(params: &Params) -> Result<Self, QueryError>;
}

/// The extractor of a [`FromQuery`] query; its rejection is a 400 saying why.
pub(crate) struct Strict<T>(pub(crate) T);

impl<S: Send + Sync, T: FromQuery> FromRequestParts<S> for Strict<T> {
    type Rejection = QueryError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, QueryError> {
        let params = Params::parse(parts.uri.query().unwrap_or_default(), T::KNOWN)?;
        T::from_query(&params).map(Strict)
    }
}

/// A query that takes no parameters.
pub(crate) struct NoQuery;

impl FromQuery for NoQuery {
    const KNOWN: &'static [&'static str] = &[];

    fn from_query(_: &Params) -> Result<Self, QueryError> {
        Ok(NoQuery)
    }
}

/// A query's parameters, decoded, each known to the route and given once.
#[derive(Debug)]
pub(crate) struct Params(Vec<(&'static str, String)>);

impl Params {
    /// Decodes `query` (`a=1&b=x+y`, `+` a space, `%XX` a byte, UTF-8 text).
    fn parse(query: &str, known: &'static [&'static str]) -> Result<Params, QueryError> {
        let mut params = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let malformed = |why| QueryError::Malformed {
                pair: pair.to_owned(),
                why,
            };
            let name = decode(name).map_err(malformed)?;
            let value = decode(value).map_err(malformed)?;
            let Some(&name) = known.iter().find(|k| **k == name) else {
                return Err(QueryError::Unknown { name, known });
            };
            if params.iter().any(|(n, _)| *n == name) {
                return Err(QueryError::Repeated { name });
            }
            params.push((name, value));
        }
        Ok(Params(params))
    }

    /// The value of `name`, if given.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name` read as a `T` (`expected` says what it should be), if
    /// given.
    pub(crate) fn parsed<T: FromStr>(
        &self,
        name: &'static str,
        expected: &'static str,
    ) -> Result<Option<T>, QueryError> {
        self.text(name)
            .map(|v| {
                v.parse().map_err(|_| QueryError::Invalid {
                    name,
                    value: v.to_owned(),
                    expected: expected.to_owned(),
                })
            })
            .transpose()
    }
}

/// Percent-decodes one name or value of a query.
fn decode(s: &str) -> Result<String, &'static str> {
    let mut bytes = Vec::with_capacity(s.len());
    let mut rest = s.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = |i: usize| rest.get(i).and_then(|&d| (d as char).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(0), hex(1)) else {
                    return Err("a % not followed by two hex digits");
                };
                bytes.push((hi * 16 + lo) as u8);
                rest = &rest[2..];
            }
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).map_err(|_| "percent-encoded bytes that are not UTF-8")
}

/// Why a query was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueryError {
    /// `pair` (as sent) could not be decoded.
    Malformed { pair: String, why: &'static str },
    /// A parameter the route does not know.
    Unknown {
        name: String,
        known: &'static [&'static str],
    },
    /// A parameter given more than once.
    Repeated { name: &'static str },
    /// A value the route cannot use.
    Invalid {
        name: &'static str,
        value: String,
        expected: String,
    },
    /// Parameters that cannot go together.
    Conflict(String),
    /// A parameter the route needs, absent or empty.
    Missing {
        name: &'static str,
        expected: &'static str,
    },
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::Malformed { pair, why } => {
                write!(f, "malformed query parameter {pair:?}: {why}")
            }
            QueryError::Unknown { name, known: [] } => {
                write!(f, "unknown query parameter {name:?}; this route takes none")
            }
            QueryError::Unknown { name, known } => write!(
                f,
                "unknown query parameter {name:?}; known: {}",
                known.join(", ")
            ),
            QueryError::Repeated { name } => {
                write!(f, "query parameter {name:?} is given more than once")
            }
            QueryError::Invalid {
                name,
                value,
                expected,
            } => write!(
                f,
                "query parameter {name:?} is {value:?}; it must be {expected}"
            ),
            QueryError::Conflict(why) => f.write_str(why),
            QueryError::Missing { name, expected } => {
                write!(f, "query parameter {name:?} is required: {expected}")
            }
        }
    }
}

impl IntoResponse for QueryError {
    fn into_response(self) -> Response {
        (StatusCode::BAD_REQUEST, format!("{self}\n")).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::{Params, QueryError};

    const KNOWN: &[&str] = &["seconds", "route"];

    #[test]
    fn known_parameters_are_decoded() {
        let p = Params::parse("seconds=5&route=POST+%2Fcheckout&", KNOWN).unwrap();
        assert_eq!(p.text("seconds"), Some("5"));
        assert_eq!(p.text("route"), Some("POST /checkout"));
        assert_eq!(p.parsed::<u64>("seconds", "a number"), Ok(Some(5)));
        let p = Params::parse("%73econds&", KNOWN).unwrap();
        assert_eq!(p.text("seconds"), Some(""));
        assert!(Params::parse("", KNOWN).unwrap().0.is_empty());
    }

    #[test]
    fn the_rest_is_refused() {
        for (query, error) in [
            (
                "SECONDS=2",
                "unknown query parameter \"SECONDS\"; known: seconds, route",
            ),
            (
                "seconds=1&seconds=2",
                "query parameter \"seconds\" is given more than once",
            ),
            (
                "%zz=1",
                "malformed query parameter \"%zz=1\": a % not followed by two hex digits",
            ),
            (
                "route=%2",
                "malformed query parameter \"route=%2\": a % not followed by two hex digits",
            ),
            (
                "route=%ff",
                "malformed query parameter \"route=%ff\": percent-encoded bytes that are not UTF-8",
            ),
        ] {
            let e = Params::parse(query, KNOWN).unwrap_err();
            assert_eq!(e.to_string(), error, "{query}");
        }
        let p = Params::parse("seconds=two", KNOWN).unwrap();
        assert!(matches!(
            p.parsed::<u64>("seconds", "a number"),
            Err(QueryError::Invalid {
                name: "seconds",
                ..
            })
        ));
    }
}
