//! `otel-ctx-reader PID [READS]`: prints the process context of PID and the thread
//! context of its threads, read from outside as a profiler reads them (ptrace: run
//! as root, or as the process's user with `kernel.yama.ptrace_scope` 0).
#![forbid(unsafe_code)]

use otel_ctx_reader::{ThreadContextReader, read_process_context};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(pid) = args.next().and_then(|p| p.parse::<i32>().ok()) else {
        eprintln!("usage: otel-ctx-reader PID [READS]");
        std::process::exit(2);
    };
    let reads: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(20);
    let key_map = match read_process_context(pid) {
        Ok(cx) => {
            println!(
                "process context: {} (published at {} ns)",
                cx.mapping_name, cx.published_at_ns
            );
            if let Some(resource) = &cx.message.resource {
                for kv in &resource.attributes {
                    println!(
                        "  resource {} = {:?}",
                        kv.key,
                        kv.value.as_ref().and_then(|v| v.value.as_ref())
                    );
                }
            }
            println!("  threadlocal.schema_version = {:?}", cx.schema_version());
            println!(
                "  threadlocal.attribute_key_map = {:?}",
                cx.attribute_key_map()
            );
            cx.attribute_key_map()
        }
        Err(e) => {
            println!("process context: none ({e:?})");
            Vec::new()
        }
    };
    let Some(reader) = ThreadContextReader::new(pid, key_map) else {
        println!("thread context: the executable exports no otel_thread_ctx_v1");
        return;
    };
    println!("thread context: {:?}", reader.symbol());
    for i in 0..reads {
        let threads = reader.threads();
        let (tid, name) = &threads[i % threads.len()];
        match reader.read(*tid, || ()) {
            Ok((read, ())) => println!("  {tid} {name}: {read:?}"),
            Err(e) => println!("  {tid} {name}: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
