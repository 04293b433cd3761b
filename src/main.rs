//! The `projector` binary: the command line of the `projector` library with the built-in
//! views. A binary with views of its own is the same line with its own registry
//! (`examples/custom_views.rs`).

fn main() -> std::process::ExitCode {
    projector::main(projector_views::registry)
}
