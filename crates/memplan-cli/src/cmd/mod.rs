//! One module per subcommand; each has `Args` (clap) and `run`, which returns a
//! [`Report`](crate::Report) or a [`Failure`](crate::Failure) and prints nothing.

pub mod completions;
pub mod devices;
pub mod plan;
pub mod probe;
pub mod simulate;
