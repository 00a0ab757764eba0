//! The example as a production service: what it listens on, how it stops, how it
//! survives running out of file descriptors, what its spans, labels and logs are
//! named, which trace contexts it honours, how many spans it exports, and what its
//! health check says. Each test runs in its own process under nextest (the profiler
//! and the tracing subscriber are process-wide).

mod accept;
mod health;
mod listen;
mod otlp_http;
mod routes;
mod shutdown;
mod spans;
mod startup;
mod support;
mod traceparent;
