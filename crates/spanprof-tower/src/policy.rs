//! Per-route profiling policy: which requests are profiled at the high rate, when a
//! request counts as slow, and which routes are not profiled at all.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
/// The configuration error of every spanprof crate: re-exported where the layer's
/// builder returns it.
pub use spanprof_core::{ConfigError, ProfileScope};
use spanprof_core::{Hotness, SpanLabelsBuilder};

/// Default share of traces whose requests are profiled at the high rate.
pub const DEFAULT_SAMPLE_RATE: f64 = 0.05;
/// Default time after which a running request is promoted to the high rate.
pub const DEFAULT_SLOW_AFTER: Duration = Duration::from_secs(1);

fn err(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(field, reason)
}

/// How one route is profiled. Every request of every enabled route is labelled and
/// sampled at the profiler's baseline rate; the policy decides which are *hot*.
///
/// ```
/// use std::time::Duration;
/// use spanprof_tower::RoutePolicy;
/// let p = RoutePolicy::new()
///     .sample_rate(0.25)
///     .slow_after(Duration::from_millis(300))
///     .high_rate_hz(2000);
/// # let _ = p;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePolicy {
    pub(crate) sample_rate: f64,
    pub(crate) slow_after: Option<Duration>,
    pub(crate) high_rate_hz: Option<u32>,
    pub(crate) long_poll: Option<Duration>,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RoutePolicy {
    /// The default policy: [`DEFAULT_SAMPLE_RATE`], slow after [`DEFAULT_SLOW_AFTER`],
    /// the profiler's high rate.
    pub fn new() -> Self {
        RoutePolicy {
            sample_rate: DEFAULT_SAMPLE_RATE,
            slow_after: Some(DEFAULT_SLOW_AFTER),
            high_rate_hz: None,
            long_poll: Some(spanprof_core::DEFAULT_LONG_POLL),
        }
    }

    /// Share of traces (0.0 to 1.0) whose requests on this route are profiled at the
    /// high rate, if the trace is sampled. The pick is a function of the trace id, so
    /// every service of one trace agrees. Defaults to [`DEFAULT_SAMPLE_RATE`].
    pub fn sample_rate(mut self, rate: f64) -> Self {
        self.sample_rate = rate;
        self
    }

    /// Promotes a request still running after `after` to the high rate for the rest
    /// of its life. Defaults to [`DEFAULT_SLOW_AFTER`].
    pub fn slow_after(mut self, after: Duration) -> Self {
        self.slow_after = Some(after);
        self
    }

    /// Never promotes requests of this route for being slow.
    pub fn never_slow(mut self) -> Self {
        self.slow_after = None;
        self
    }

    /// The high sampling rate for hot requests of this route. Defaults to the
    /// profiler's high rate. Must not be below the profiler's baseline rate.
    pub fn high_rate_hz(mut self, hz: u32) -> Self {
        self.high_rate_hz = Some(hz);
        self
    }

    /// Reports a poll of a request of this route that holds its worker at least
    /// `threshold` (a blocking call, or heavy work, inside an async poll): an event
    /// `spanprof.long_poll` on the request's span, its count in
    /// `spanprof.long_polls`, and a warning (the first, then at most one a minute).
    /// `None` turns it off. Defaults to [`spanprof_core::DEFAULT_LONG_POLL`] (10 ms).
    pub fn long_poll(mut self, threshold: Option<Duration>) -> Self {
        self.long_poll = threshold.filter(|d| !d.is_zero());
        self
    }

    pub(crate) fn validate(&self, field: &str, baseline_hz: u32) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.sample_rate) {
            return Err(err(
                format!("{field}.sample_rate"),
                format!("{} is not a rate between 0.0 and 1.0", self.sample_rate),
            ));
        }
        if let Some(hz) = self.high_rate_hz {
            if hz < baseline_hz {
                return Err(err(
                    format!("{field}.high_rate_hz"),
                    format!("{hz} Hz is below the profiler's baseline rate of {baseline_hz} Hz"),
                ));
            }
            if hz > spanprof_core::MAX_HIGH_HZ {
                return Err(err(
                    format!("{field}.high_rate_hz"),
                    format!(
                        "{hz} Hz is above the maximum of {} Hz",
                        spanprof_core::MAX_HIGH_HZ
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The decision for a request: hot (`Sampled`) if the trace is sampled and the
    /// route's rate picks the trace id.
    #[inline]
    /// `b` with this policy's slow threshold and high rate, where it sets them.
    pub(crate) fn apply(&self, mut b: SpanLabelsBuilder) -> SpanLabelsBuilder {
        if let Some(after) = self.slow_after {
            b = b.slow_after(after);
        }
        if let Some(hz) = self.high_rate_hz {
            b = b.high_rate_hz(hz);
        }
        b
    }

    pub(crate) fn decide(&self, trace_id: u128, trace_sampled: bool) -> Hotness {
        if trace_sampled && rate_picks(trace_id, self.sample_rate) {
            Hotness::Sampled
        } else {
            Hotness::Cold
        }
    }
}

/// Whether a rate picks this trace id: a deterministic function of the id (so every
/// service of a trace that uses spanprof agrees), uniform over ids.
pub fn rate_picks(trace_id: u128, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 || rate.is_nan() {
        return false;
    }
    let x = splitmix64((trace_id >> 64) as u64 ^ (trace_id as u64).rotate_left(29));
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < rate
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// [`ProfileScope`] as configuration: `"local_root"` or `"all_spans"`.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ScopeName {
    LocalRoot,
    AllSpans,
}

fn deserialize_scope<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<ProfileScope>, D::Error> {
    Ok(Option::<ScopeName>::deserialize(d)?.map(|name| match name {
        ScopeName::LocalRoot => ProfileScope::LocalRoot,
        ScopeName::AllSpans => ProfileScope::AllSpans,
    }))
}

/// A route key: a route template (`/cart/{id}`, `/pkg.Service/Method`), optionally
/// preceded by an HTTP method (`POST /checkout`).
pub(crate) fn validate_route(field: &str, key: &str) -> Result<(), ConfigError> {
    let (method, path) = match key.split_once(' ') {
        Some((m, p)) => (Some(m), p),
        None => (None, key),
    };
    if let Some(m) = method
        && (m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
    {
        return Err(err(
            field,
            format!("`{m}` is not an HTTP method (uppercase, like POST)"),
        ));
    }
    let bad = |why: &str| Err(err(field, format!("route `{key}` can never match: {why}")));
    if !path.starts_with('/') {
        return bad("a route template starts with `/`");
    }
    if path.contains(['?', '#']) {
        return bad(
            "routes are path templates; query strings and fragments are never part of them",
        );
    }
    if path.chars().any(char::is_whitespace) {
        return bad("it contains whitespace");
    }
    if path
        .split('/')
        .any(|seg| seg.starts_with(':') || seg.starts_with('*') && seg.len() > 1)
    {
        return bad("axum 0.8 templates write parameters as `{id}` and wildcards as `{*rest}`");
    }
    if path.contains("//") {
        return bad("it contains an empty segment (`//`)");
    }
    Ok(())
}

/// The policy table: per-route policies, disabled routes and the default.
#[derive(Debug, Clone)]
pub(crate) struct Policies {
    pub(crate) default: RoutePolicy,
    pub(crate) routes: HashMap<String, RoutePolicy, foldhash::fast::RandomState>,
    pub(crate) disabled: Vec<String>,
}

impl Policies {
    pub(crate) fn new() -> Self {
        Policies {
            default: RoutePolicy::new(),
            routes: HashMap::default(),
            disabled: Vec::new(),
        }
    }

    /// The policy for a request, `None` if the route is disabled.
    #[inline]
    pub(crate) fn lookup(&self, method: &str, route: &str) -> Option<&RoutePolicy> {
        if self
            .disabled
            .iter()
            .any(|d| d == route || d.split_once(' ') == Some((method, route)))
        {
            return None;
        }
        let keyed = format!("{method} {route}");
        Some(
            self.routes
                .get(&keyed)
                .or_else(|| self.routes.get(route))
                .unwrap_or(&self.default),
        )
    }

    pub(crate) fn validate(&self, baseline_hz: u32) -> Result<(), ConfigError> {
        self.default.validate("default", baseline_hz)?;
        for (route, p) in &self.routes {
            let field = format!("routes[{route:?}]");
            validate_route(&field, route)?;
            p.validate(&field, baseline_hz)?;
        }
        for (i, route) in self.disabled.iter().enumerate() {
            validate_route(&format!("disabled[{i}]"), route)?;
        }
        Ok(())
    }
}

/// Profiling policy as configuration (for example a JSON or TOML section), with the
/// same rules as the code API. Durations are strings such as `"300ms"`, `"1.5s"`.
///
/// ```
/// let cfg: spanprof_tower::PolicyConfig = serde_json::from_str(r#"{
///     "default": { "sample_rate": 0.05, "slow_after": "1s" },
///     "routes": { "POST /checkout": { "sample_rate": 0.1, "slow_after": "250ms", "high_rate_hz": 2000 } },
///     "disabled": ["/health"],
///     "scope": "local_root"
/// }"#).unwrap();
/// let layer = spanprof_tower::ProfileCorrelationLayer::builder().config(cfg).build().unwrap();
/// # drop(layer);
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PolicyConfig {
    /// The policy for routes not listed.
    #[serde(default)]
    pub default: Option<RoutePolicyConfig>,
    /// Policies by route (`/path/{param}` or `METHOD /path/{param}`).
    #[serde(default)]
    pub routes: HashMap<String, RoutePolicyConfig>,
    /// Routes never labelled or profiled.
    #[serde(default)]
    pub disabled: Vec<String>,
    /// Which spans carry their own profile id, for the whole process and its sinks
    /// (see [`crate::ProfileCorrelationLayerBuilder::scope`]); unset leaves the scope
    /// as it is.
    #[serde(default, deserialize_with = "deserialize_scope")]
    pub scope: Option<ProfileScope>,
}

impl PolicyConfig {
    /// The policy from the environment, `None` when no variable is set:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `SPANPROF_POLICY` | a whole [`PolicyConfig`] as JSON (the format above) |
    /// | `SPANPROF_SAMPLE_RATE` | the default policy's `sample_rate` (`0.05`) |
    /// | `SPANPROF_SLOW_AFTER` | the default policy's `slow_after` (`"250ms"`, `"never"`) |
    /// | `SPANPROF_DISABLED_ROUTES` | routes never profiled, comma-separated (`/health,/metrics`) |
    ///
    /// The single variables override the same settings in `SPANPROF_POLICY`.
    /// [`crate::ProfileCorrelationLayerBuilder::build`] reads them under whatever
    /// the code configures (code wins); errors name the variable.
    ///
    /// ```
    /// let from_env = spanprof_tower::PolicyConfig::from_env().unwrap();
    /// # drop(from_env);
    /// ```
    pub fn from_env() -> Result<Option<PolicyConfig>, ConfigError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    pub(crate) fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<PolicyConfig>, ConfigError> {
        let policy = var("SPANPROF_POLICY");
        let rate = var("SPANPROF_SAMPLE_RATE");
        let slow = var("SPANPROF_SLOW_AFTER");
        let disabled = var("SPANPROF_DISABLED_ROUTES");
        if policy.is_none() && rate.is_none() && slow.is_none() && disabled.is_none() {
            return Ok(None);
        }
        let mut cfg = match policy {
            Some(json) => serde_json::from_str::<PolicyConfig>(&json)
                .map_err(|e| err("SPANPROF_POLICY", e.to_string()))?,
            None => PolicyConfig::default(),
        };
        if rate.is_some() || slow.is_some() {
            let d = cfg.default.get_or_insert_with(RoutePolicyConfig::default);
            if let Some(r) = rate {
                let r: f64 = r
                    .trim()
                    .parse()
                    .map_err(|_| err("SPANPROF_SAMPLE_RATE", format!("`{r}` is not a number")))?;
                d.sample_rate = Some(r);
            }
            if let Some(v) = slow {
                let v = serde_json::Value::String(v.trim().to_owned());
                parse_slow_after("SPANPROF_SLOW_AFTER", &v)?;
                d.slow_after = Some(v);
            }
        }
        if let Some(list) = disabled {
            cfg.disabled.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|r| !r.is_empty())
                    .map(str::to_owned),
            );
        }
        Ok(Some(cfg))
    }
}

/// One route's policy as configuration; unset fields take the defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RoutePolicyConfig {
    /// See [`RoutePolicy::sample_rate`].
    pub sample_rate: Option<f64>,
    /// See [`RoutePolicy::slow_after`]: a duration string with its unit (`"250ms"`,
    /// `"1.5s"`), a JSON number of milliseconds (`250`), or `"never"`. A string
    /// without a unit (`"250"`) is refused.
    pub slow_after: Option<serde_json::Value>,
    /// See [`RoutePolicy::high_rate_hz`].
    pub high_rate_hz: Option<i64>,
    /// See [`RoutePolicy::long_poll`]: a duration with its unit (`"10ms"`), a JSON
    /// number of milliseconds, or `"never"`.
    pub long_poll: Option<serde_json::Value>,
}

impl RoutePolicyConfig {
    pub(crate) fn to_policy(&self, field: &str) -> Result<RoutePolicy, ConfigError> {
        let mut p = RoutePolicy::new();
        if let Some(r) = self.sample_rate {
            p = p.sample_rate(r);
        }
        if let Some(v) = &self.slow_after {
            p.slow_after = parse_slow_after(&format!("{field}.slow_after"), v)?;
        }
        if let Some(v) = &self.long_poll {
            p = p.long_poll(parse_slow_after(&format!("{field}.long_poll"), v)?);
        }
        if let Some(hz) = self.high_rate_hz {
            let hz = u32::try_from(hz).map_err(|_| {
                err(
                    format!("{field}.high_rate_hz"),
                    format!("{hz} is not a rate in Hz"),
                )
            })?;
            p = p.high_rate_hz(hz);
        }
        Ok(p)
    }
}

fn parse_slow_after(field: &str, v: &serde_json::Value) -> Result<Option<Duration>, ConfigError> {
    match v {
        serde_json::Value::String(s) if s == "never" => Ok(None),
        serde_json::Value::String(s) => parse_duration(s).map(Some).map_err(|why| err(field, why)),
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(ms) if ms >= 0.0 && ms.is_finite() => Ok(Some(Duration::from_secs_f64(ms / 1e3))),
            _ => Err(err(
                field,
                format!("{n} is not a non-negative number of milliseconds"),
            )),
        },
        other => Err(err(
            field,
            format!("{other} is not a duration such as \"300ms\""),
        )),
    }
}

/// Parses `"300ms"`, `"1.5s"`, `"2m"`, `"500us"`, `"100ns"`. A number without a unit
/// is refused (is `"250"` milliseconds or seconds?), except `"0"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as \"300ms\" or \"1.5s\""))?;
    if value < 0.0 || !value.is_finite() {
        return Err(format!(
            "`{s}` is negative; a duration must be zero or more"
        ));
    }
    let secs = match unit.trim() {
        "ns" => value / 1e9,
        "us" | "µs" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "" if value == 0.0 => 0.0,
        "" => {
            return Err(format!(
                "`{s}` has no unit: write \"{num}ms\" or \"{num}s\" (a JSON number, unquoted, is milliseconds)"
            ));
        }
        "m" | "min" => value * 60.0,
        other => {
            return Err(format!(
                "`{other}` is not a duration unit (ns, us, ms, s, m)"
            ));
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_deterministic_and_roughly_uniform() {
        let picked = (0..100_000u128)
            .filter(|i| {
                rate_picks(
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834),
                    0.25,
                )
            })
            .count();
        assert!((24_000..26_000).contains(&picked), "{picked}");
        assert_eq!(rate_picks(42, 0.5), rate_picks(42, 0.5));
        assert!(!rate_picks(42, 0.0));
        assert!(rate_picks(42, 1.0));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("-5ms").unwrap_err().contains("negative"));
        assert!(parse_duration("5 parsecs").is_err());
        // Unitless is ambiguous (a JSON number means milliseconds): refused, naming both.
        let e = parse_duration("250").unwrap_err();
        assert!(e.contains("\"250ms\"") && e.contains("\"250s\""), "{e}");
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn policy_from_the_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(PolicyConfig::from_vars(vars(&[])).unwrap().is_none());
        let cfg = PolicyConfig::from_vars(vars(&[
            (
                "SPANPROF_POLICY",
                r#"{"routes": {"/hash": {"sample_rate": 1.0}}}"#,
            ),
            ("SPANPROF_SAMPLE_RATE", "0.2"),
            ("SPANPROF_SLOW_AFTER", "250ms"),
            ("SPANPROF_DISABLED_ROUTES", "/health, /metrics"),
        ]))
        .unwrap()
        .unwrap();
        let d = cfg.default.as_ref().unwrap().to_policy("default").unwrap();
        assert_eq!(d.sample_rate, 0.2);
        assert_eq!(d.slow_after, Some(Duration::from_millis(250)));
        assert_eq!(cfg.disabled, ["/health", "/metrics"]);
        assert!(cfg.routes.contains_key("/hash"));
        for (var, value) in [
            ("SPANPROF_SAMPLE_RATE", "often"),
            ("SPANPROF_SLOW_AFTER", "250"),
            ("SPANPROF_POLICY", "{\"rutes\": {}}"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(Box::new([(var, value)]));
            let e = PolicyConfig::from_vars(vars(pairs)).unwrap_err();
            assert_eq!(e.field, var, "{e}");
        }
    }

    #[test]
    fn route_keys() {
        assert!(validate_route("f", "/checkout").is_ok());
        assert!(validate_route("f", "POST /cart/{id}").is_ok());
        assert!(validate_route("f", "/inventory.Inventory/Reserve").is_ok());
        assert!(validate_route("f", "checkout").is_err());
        assert!(validate_route("f", "/cart?id=1").is_err());
        assert!(validate_route("f", "/cart/:id").is_err());
        assert!(validate_route("f", "post /cart").is_err());
    }
}
