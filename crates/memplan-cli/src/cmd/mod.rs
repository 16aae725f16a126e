//! One module per subcommand; each has `Args` (clap) and `run`.

pub mod devices;
pub mod plan;
pub mod probe;
pub mod simulate;
