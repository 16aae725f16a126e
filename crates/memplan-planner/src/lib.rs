//! Work in progress.

pub mod budget;
