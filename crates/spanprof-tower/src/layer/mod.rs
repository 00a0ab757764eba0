//! [`ProfileCorrelationLayer`]: labels every poll of a request with its span and
//! decides, per route, whether it is profiled at the high rate.
//!
//! One file per concern, as tower-http's `trace` module: the layer and its builder
//! here, the service in `service.rs`, the response future and body in `future.rs`,
//! route naming in `make_route.rs`, trace identity in `trace_context.rs`.

mod future;
mod make_route;
mod service;
mod trace_context;

use std::sync::Arc;

use spanprof_core::{Hotness, PollTimer, Profiler, SpanLabels};

pub use future::{ProfiledBody, ResponseFuture};
pub use make_route::{
    DEFAULT_MAX_ROUTES, DefaultRoute, GrpcRoute, MAX_MAX_ROUTES, MakeRoute, UNKNOWN_ROUTE,
    UNMATCHED_ROUTE,
};
pub use service::ProfileCorrelation;
pub use trace_context::extract_trace_context;

use crate::policy::{ConfigError, Policies, PolicyConfig, ProfileScope, RoutePolicy};

#[cfg(test)]
mod tests {
    #[test]
    fn the_service_clones_one_reference_count() {
        // axum clones a route's service per request: the correlator must be one Arc.
        assert_eq!(
            std::mem::size_of::<super::Correlator>(),
            std::mem::size_of::<usize>()
        );
    }
}
use crate::{registry, setup};

/// A `tower::Layer` that attaches span-derived labels (trace id, span id, span name,
/// route) to every poll of each request, so every CPU sample taken while the
/// request's code runs — on whichever worker thread — carries them; and that picks,
/// per route, which requests are profiled at the high rate.
///
/// Place it inside `tower_http::trace::TraceLayer` with `tracing-opentelemetry`
/// installed: it reads the OpenTelemetry span context of the current `tracing` span.
/// Without a tracing span it uses an incoming W3C `traceparent` header (labels then
/// carry the caller's trace id and a span id of spanprof's own, which no exported
/// span has); with neither, requests are still labelled by route with a random span
/// id and no trace id, so per-route and per-request profiles work but nothing links
/// them to traces.
///
/// ```
/// use axum::{Router, routing::get};
/// use spanprof_tower::ProfileCorrelationLayer;
///
/// let app: Router = Router::new()
///     .route("/health", get(|| async { "ok" }))
///     .layer(ProfileCorrelationLayer::new());
/// ```
#[derive(Clone, Debug)]
pub struct ProfileCorrelationLayer<R = DefaultRoute> {
    pub(crate) correlator: Correlator,
    make_route: R,
}

impl ProfileCorrelationLayer {
    /// The layer with the default policy ([`RoutePolicy::new`]) for every route; starts
    /// the profiler with its defaults if none is running (and logs, not fails, where
    /// profiling is unavailable).
    ///
    /// The policy comes from the `SPANPROF_*` environment variables where set
    /// ([`PolicyConfig::from_env`]); if they are invalid, this logs the error (naming
    /// the variable) and uses the defaults. [`ProfileCorrelationLayer::builder`]'s
    /// `build` returns that error instead.
    pub fn new() -> Self {
        match ProfileCorrelationLayer::builder().build() {
            Ok(layer) => layer,
            Err(e) => {
                tracing::error!(error = %e, "spanprof: ignoring the SPANPROF_* policy variables");
                let mut b = ProfileCorrelationLayer::builder();
                b.ignore_env = true;
                b.build().expect("the default configuration is valid")
            }
        }
    }

    /// Starts a configured layer.
    pub fn builder() -> ProfileCorrelationLayerBuilder {
        ProfileCorrelationLayerBuilder::default()
    }
}

impl Default for ProfileCorrelationLayer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tonic")]
impl ProfileCorrelationLayer<GrpcRoute> {
    /// The layer for a gRPC server (tonic): the route is the method path
    /// `/package.Service/Method`; server streams stay labelled for their whole life
    /// (the response body is polled with the call's labels).
    ///
    /// ```
    /// use spanprof_tower::ProfileCorrelationLayer;
    /// let server = tonic::transport::Server::builder()
    ///     .layer(ProfileCorrelationLayer::new_for_grpc());
    /// // server.add_service(MyServiceServer::new(my_service)).serve(addr)
    /// # drop(server);
    /// ```
    pub fn new_for_grpc() -> Self {
        ProfileCorrelationLayer::new().make_route(GrpcRoute)
    }
}

impl<R> ProfileCorrelationLayer<R> {
    /// Requests labelled [`UNKNOWN_ROUTE`] because this layer had already named its
    /// bound of distinct routes ([`ProfileCorrelationLayerBuilder::max_routes`]).
    pub fn unknown_routes(&self) -> u64 {
        self.correlator.0.routes.unknown()
    }

    /// Route keys of this layer's configuration (per-route policies and disabled
    /// routes) that no request has matched so far: their routes had no request yet,
    /// or the key is not the router's template. The layer logs a key, once, when a
    /// request arrives under a route it was evidently meant for (`/cart/{id}` for a
    /// key `/cart/{cart_id}` or `/cart/42`).
    pub fn unmatched_route_keys(&self) -> Vec<String> {
        self.correlator.0.keys.unmatched()
    }

    /// Replaces how routes are named (for example a closure for plain hyper servers).
    pub fn make_route<R2>(self, make_route: R2) -> ProfileCorrelationLayer<R2> {
        ProfileCorrelationLayer {
            correlator: self.correlator,
            make_route,
        }
    }
}

impl<S, R: Clone> tower_layer::Layer<S> for ProfileCorrelationLayer<R> {
    type Service = ProfileCorrelation<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        ProfileCorrelation::new(inner, self.correlator.clone(), self.make_route.clone())
    }
}

/// Builds a [`ProfileCorrelationLayer`]; configuration errors are reported by
/// [`ProfileCorrelationLayerBuilder::build`], naming the field.
#[derive(Debug, Default)]
pub struct ProfileCorrelationLayerBuilder {
    default: Option<RoutePolicy>,
    routes: Vec<(String, RoutePolicy)>,
    disabled: Vec<String>,
    scope: Option<ProfileScope>,
    config: Option<PolicyConfig>,
    profiler: Option<Profiler>,
    max_routes: Option<usize>,
    ignore_env: bool,
}

impl ProfileCorrelationLayerBuilder {
    /// The policy of routes not listed. Defaults to [`RoutePolicy::new`].
    pub fn default_policy(mut self, policy: RoutePolicy) -> Self {
        self.default = Some(policy);
        self
    }

    /// The policy of one route: a route template (`/checkout`, `/cart/{id}`,
    /// `/pkg.Service/Method`), optionally with a method (`POST /checkout`).
    pub fn route(mut self, route: impl Into<String>, policy: RoutePolicy) -> Self {
        self.routes.push((route.into(), policy));
        self
    }

    /// Requests of this route are neither labelled nor profiled.
    pub fn disable_route(mut self, route: impl Into<String>) -> Self {
        self.disabled.push(route.into());
        self
    }

    /// Which spans carry their own profile id, for the whole process: this layer's
    /// spans, every other layer's, and the samples every sink exports (the setting is
    /// [`spanprof_core::scope::current_scope`], which `spanprof-export`'s
    /// `ProfileSource::profiler` reads for each profile). Defaults to
    /// [`ProfileScope::LocalRoot`]. A layer built without a scope (here or in the
    /// policy file) leaves the one set before; two layers that set different scopes
    /// log one warning, and the last one built wins.
    pub fn scope(mut self, scope: ProfileScope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Policies from configuration; routes set in code as well override it.
    pub fn config(mut self, config: PolicyConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// The most distinct span names (`METHOD route`, or the gRPC method path) this
    /// layer hands out; requests of routes new past it are labelled [`UNKNOWN_ROUTE`]
    /// (counted: [`ProfileCorrelationLayer::unknown_routes`], with one warning). Names
    /// are never forgotten (see `spanprof::stats::intern_stats`), so this keeps a client
    /// that makes up paths or gRPC methods from using them all. Defaults to
    /// [`DEFAULT_MAX_ROUTES`] (512). At least 1, at most [`MAX_MAX_ROUTES`] (65 536);
    /// the layer's route table reserves 32 to 64 bytes per route of the bound (16 KiB
    /// at the default). Each distinct method and route counts once (`GET /cart/{id}`
    /// and `PUT /cart/{id}` are two).
    pub fn max_routes(mut self, max: usize) -> Self {
        self.max_routes = Some(max);
        self
    }

    /// Uses this profiler instead of the running one (or a new default one).
    pub fn profiler(mut self, profiler: Profiler) -> Self {
        self.profiler = Some(profiler);
        self
    }

    /// Validates the configuration and builds the layer.
    ///
    /// Settings come, each overriding the one before: the defaults, the `SPANPROF_*`
    /// environment variables ([`PolicyConfig::from_env`]), [`Self::config`], then
    /// the builder's own methods. Errors name the field or variable.
    pub fn build(self) -> Result<ProfileCorrelationLayer, ConfigError> {
        let mut policies = Policies::new();
        let mut scope = None;
        let env = if self.ignore_env {
            None
        } else {
            PolicyConfig::from_env()?
        };
        for cfg in env.iter().chain(&self.config) {
            if let Some(d) = &cfg.default {
                policies.default = d.to_policy("default")?;
            }
            for (route, p) in &cfg.routes {
                let policy = p.to_policy(&format!("routes[{route:?}]"))?;
                policies.routes.insert(route.clone(), policy);
            }
            policies.disabled.extend(cfg.disabled.iter().cloned());
            scope = cfg.scope.or(scope);
        }
        if let Some(d) = self.default {
            policies.default = d;
        }
        for (route, p) in self.routes {
            policies.routes.insert(route, p);
        }
        policies.disabled.extend(self.disabled);
        scope = self.scope.or(scope);
        let profiler = match self.profiler {
            Some(p) => Some(p),
            None => match Profiler::current_or_start() {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(error = %e, "spanprof: profiling unavailable; requests are still labelled");
                    None
                }
            },
        };
        let baseline = profiler
            .as_ref()
            .map_or(spanprof_core::DEFAULT_BASELINE_HZ, |p| {
                p.capabilities().baseline_hz
            });
        policies.validate(baseline)?;
        let max_routes = self.max_routes.unwrap_or(DEFAULT_MAX_ROUTES);
        if max_routes == 0 {
            return Err(ConfigError::new("max_routes", "must be at least 1"));
        }
        if max_routes > MAX_MAX_ROUTES {
            return Err(ConfigError::new(
                "max_routes",
                "must be at most 65536 (MAX_MAX_ROUTES): past the interner's bound new names read (other) anyway",
            ));
        }
        if let Some(scope) = scope {
            setup::set_scope(scope);
        }
        // The layer is built as the service starts: check what can be checked now.
        spanprof_core::setup::check_at_start();
        // quanta calibrates its clock on first use (milliseconds): here, not in the
        // first request.
        PollTimer::calibrate();
        spanprof_core::init_latency();
        let keys = policies
            .routes
            .keys()
            .chain(&policies.disabled)
            .cloned()
            .collect();
        Ok(ProfileCorrelationLayer {
            correlator: Correlator(Arc::new(CorrelatorState {
                keys: setup::RouteKeys::new(keys),
                spans: setup::SpanEvidence::default(),
                policies,
                routes: make_route::RouteTable::new(max_routes),
                _profiler: profiler,
            })),
            make_route: DefaultRoute,
        })
    }
}

/// The per-request decisions shared by the tower service and the hyper adapter.
///
/// One reference count: axum clones a route's service for every request (and tower's
/// `Buffer` and others clone too), so each clone is one shared atomic increment, and
/// its drop one decrement, whatever the layer holds.
#[derive(Clone, Debug)]
pub(crate) struct Correlator(Arc<CorrelatorState>);

#[derive(Debug)]
pub(crate) struct CorrelatorState {
    policies: Policies,
    /// Which configured route keys requests have matched (set-up check).
    keys: setup::RouteKeys,
    /// Whether requests have had a `tracing` span current (set-up check).
    spans: setup::SpanEvidence,
    /// Each route seen, with its names and policy.
    routes: make_route::RouteTable,
    /// Keeps the profiler this layer was built against.
    _profiler: Option<Profiler>,
}

/// The state of one profiled request: its labels and their poll accounting (the
/// core's per-poll path, `spanprof_core::PollTimer`).
#[derive(Debug)]
pub(crate) struct RequestProfile {
    pub(crate) labels: SpanLabels,
    pub(crate) timer: PollTimer,
}

impl RequestProfile {
    /// Runs one poll with the labels pushed, accounting its time (and promoting the
    /// request once it has run past its slow threshold).
    #[inline]
    pub(crate) fn poll<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.timer.poll(&self.labels, f)
    }

    /// [`RequestProfile::poll`] for a future's poll: hot requests also measure their
    /// scheduling delay through `cx`'s waker.
    #[inline]
    pub(crate) fn poll_with_context<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        f: impl FnOnce(&mut std::task::Context<'_>) -> T,
    ) -> T {
        self.timer.poll_with_context(&self.labels, cx, f)
    }

    /// Makes the accounting so far visible on the labels (for the span processor).
    #[inline]
    pub(crate) fn publish(&self) {
        self.labels.publish_poll_stats(self.timer.stats());
    }
}

impl Correlator {
    /// Decides and labels one request; `None` for disabled routes. `names_routes`:
    /// whether the route namer can name HTTP routes at all (set-up check).
    #[inline]
    pub(crate) fn begin<B>(
        &self,
        request: &http::Request<B>,
        route: Option<&str>,
        names_routes: bool,
    ) -> Option<RequestProfile> {
        let state = &*self.0;
        let grpc = make_route::is_grpc(request.headers());
        if route.is_none() && !grpc && !names_routes {
            setup::check_route_keys_visible(state.keys.keys());
        }
        let tag = make_route::method_tag(request.method(), grpc);
        // Found without a lock or an allocation for a name seen before; decided (the
        // names interned, the policy looked up, the configured keys matched) once.
        let entry = state
            .routes
            .entry(tag, route.unwrap_or(UNMATCHED_ROUTE), |method, route| {
                state.keys.observe(method, route);
                state.policies.lookup(method, route).cloned()
            });
        let policy = entry.policy.as_ref()?;
        let trace = trace_context::current(request.headers());
        state
            .spans
            .observe(trace.source, entry.span_name, request.headers());
        let decision_id = if trace.trace_id != 0 {
            trace.trace_id
        } else {
            u128::from(trace.span_id)
        };
        let hot = policy.decide(decision_id, trace.sampled);
        let labels = registry::labelled(trace.otel_span && trace.sampled, hot, |report| {
            let b = SpanLabels::builder()
                .trace_id(trace.trace_id)
                .span_id(trace.span_id)
                .parent_span_id(trace.parent_span_id)
                .root_span_id(trace.span_id)
                .span_name_id(entry.span_name)
                .route_id(entry.route)
                .trace_flags(u8::from(trace.sampled))
                .hot(hot)
                .report_first_sample(report);
            policy.apply(b).build()
        });
        // Work already hot needs no promotion.
        let slow_after = policy.slow_after.filter(|_| hot == Hotness::Cold);
        Some(RequestProfile {
            labels,
            timer: PollTimer::new(slow_after).long_poll(policy.long_poll),
        })
    }
}
