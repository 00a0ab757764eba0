//! `#[spanprof::main]`: what `#[tokio::main]` does, with spanprof's runtime hooks
//! installed. Use it through the `spanprof` crate.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ItemFn, Lit, MetaNameValue, Token};

/// Runs an `async fn` (usually `main`) on a tokio runtime built with
/// `spanprof::install_runtime_hooks`, as `#[tokio::main]` would without them: a
/// multi-thread runtime with every driver enabled, or the one its arguments ask for
/// (`flavor = "current_thread"`, `worker_threads = 4`). The hooks register every
/// runtime thread for sampling and, with `--cfg tokio_unstable`, let tasks a request
/// spawns inherit its labels; the thread that runs `main`'s future is registered too.
/// Anything else about the runtime is tokio's.
///
/// ```ignore
/// #[spanprof::main]
/// async fn main() { /* … */ }
/// ```
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The runtime the arguments ask for.
struct Config {
    current_thread: bool,
    worker_threads: Option<usize>,
    krate: syn::Path,
}

fn parse_config(args: TokenStream2) -> syn::Result<Config> {
    let mut config = Config {
        current_thread: false,
        worker_threads: None,
        krate: syn::parse_quote!(::spanprof),
    };
    let args = Punctuated::<MetaNameValue, Token![,]>::parse_terminated.parse2(args)?;
    for arg in args {
        let name = arg
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let value = match &arg.value {
            Expr::Lit(ExprLit { lit, .. }) => lit,
            other => return Err(syn::Error::new_spanned(other, "expected a literal")),
        };
        match (name.as_str(), value) {
            ("flavor", Lit::Str(s)) => match s.value().as_str() {
                "multi_thread" => config.current_thread = false,
                "current_thread" => config.current_thread = true,
                other => {
                    return Err(syn::Error::new_spanned(
                        s,
                        format!(
                            "flavor: `{other}` is not a runtime flavor: use \"multi_thread\" or \"current_thread\""
                        ),
                    ));
                }
            },
            ("worker_threads", Lit::Int(n)) => {
                let n: usize = n.base10_parse()?;
                if n == 0 {
                    return Err(syn::Error::new_spanned(
                        value,
                        "worker_threads: must be at least 1",
                    ));
                }
                config.worker_threads = Some(n);
            }
            ("crate", Lit::Str(s)) => config.krate = s.parse()?,
            _ => {
                return Err(syn::Error::new_spanned(
                    &arg,
                    format!(
                        "#[spanprof::main]: unknown or malformed argument `{name}`: the arguments are \
                         flavor = \"multi_thread\" | \"current_thread\", worker_threads = N and crate = \"path\""
                    ),
                ));
            }
        }
    }
    if config.current_thread && config.worker_threads.is_some() {
        return Err(syn::Error::new(
            Span::call_site(),
            "worker_threads: a current_thread runtime has no worker threads",
        ));
    }
    Ok(config)
}

fn expand(args: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let config = parse_config(args)?;
    let mut f: ItemFn = syn::parse2(item)?;
    if f.sig.asyncness.take().is_none() {
        return Err(syn::Error::new_spanned(
            f.sig.fn_token,
            "#[spanprof::main] goes on an `async fn`, as #[tokio::main] does",
        ));
    }
    let krate = &config.krate;
    let builder = if config.current_thread {
        quote!(::tokio::runtime::Builder::new_current_thread())
    } else {
        quote!(::tokio::runtime::Builder::new_multi_thread())
    };
    let workers = config
        .worker_threads
        .map(|n| quote!(builder.worker_threads(#n);));
    let body = &f.block;
    f.block = syn::parse2(quote!({
        let body = async move #body;
        let mut builder = #builder;
        #workers
        #krate::install_runtime_hooks(&mut builder);
        // The thread that blocks on `body` runs it (and, current-thread, every task):
        // sampled too, not only the runtime's own threads.
        #krate::register_current_thread();
        builder
            .enable_all()
            .build()
            .expect("Failed building the Runtime")
            .block_on(body)
    }))?;
    Ok(quote!(#f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(args: &str, item: &str) -> Result<String, String> {
        expand(args.parse().unwrap(), item.parse().unwrap())
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_runtime_asked_for_is_built_with_the_hooks() {
        let out = expanded("", "async fn main() { run().await }").unwrap();
        assert!(out.contains("new_multi_thread"), "{out}");
        assert!(
            out.contains(":: spanprof :: install_runtime_hooks"),
            "{out}"
        );
        assert!(!out.contains("async fn"), "{out}");
        let out = expanded(
            "flavor = \"current_thread\"",
            "async fn main() -> Result<(), ()> { Ok(()) }",
        )
        .unwrap();
        assert!(out.contains("new_current_thread"), "{out}");
        let out = expanded("worker_threads = 3", "async fn main() {}").unwrap();
        assert!(out.contains("worker_threads (3usize)"), "{out}");
    }

    #[test]
    fn mistakes_are_errors_naming_what_to_write() {
        let e = expanded("flavor = \"fast\"", "async fn main() {}").unwrap_err();
        assert!(e.contains("current_thread"), "{e}");
        let e = expanded("workers = 2", "async fn main() {}").unwrap_err();
        assert!(e.contains("unknown or malformed argument `workers`"), "{e}");
        let e = expanded("", "fn main() {}").unwrap_err();
        assert!(e.contains("async fn"), "{e}");
        let e = expanded(
            "flavor = \"current_thread\", worker_threads = 2",
            "async fn main() {}",
        )
        .unwrap_err();
        assert!(e.contains("no worker threads"), "{e}");
    }
}
