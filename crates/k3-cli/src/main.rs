//! `k3`: the command-line front end. Thin: parses flags, calls the engine, maps errors to exit
//! codes once (0 ok, 1 runtime failure, 2 usage/config/refusal, 4 expert load failure).

fn main() {
    println!("k3 {}", env!("CARGO_PKG_VERSION"));
}
