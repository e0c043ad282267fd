//! `#[liqo_e2e::test]`: a `#[tokio::test]` whose testbeds keep their
//! folder and print their logs when the test fails, whether it panics or
//! returns an error (`liqo_testbed::failure`).

use proc_macro::TokenStream;
use quote::quote;
use syn::{ItemFn, parse_macro_input};

/// Marks an async end-to-end test. Its arguments are `#[tokio::test]`'s
/// (`flavor = "multi_thread", worker_threads = 2`). The body runs as an
/// inner function under a `liqo_testbed::failure::Watch`, which learns
/// the outcome once the body has returned and its testbeds were dropped.
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = proc_macro2::TokenStream::from(args);
    let test = parse_macro_input!(item as ItemFn);
    if test.sig.asyncness.is_none() || !test.sig.inputs.is_empty() {
        return syn::Error::new_spanned(
            &test.sig,
            "#[liqo_e2e::test] marks an async fn without arguments",
        )
        .to_compile_error()
        .into();
    }
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
        ..
    } = test;
    let output = &sig.output;
    quote! {
        #(#attrs)*
        #[::tokio::test(#args)]
        #vis #sig {
            async fn body() #output #block
            let watch = ::liqo_e2e::failure::Watch::start();
            let outcome = body().await;
            watch.finish(::liqo_e2e::Outcome::failed(&outcome));
            outcome
        }
    }
    .into()
}
