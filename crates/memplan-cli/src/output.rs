//! Shared output helpers: logging set-up and JSON printing.

use tracing_subscriber::EnvFilter;

/// Log to stderr; `--log` wins over `MEMPLAN_LOG`; default `warn`.
pub fn init_logging(level: Option<&str>) {
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).ok(),
        None => EnvFilter::try_from_env("MEMPLAN_LOG").ok(),
    }
    .unwrap_or_else(|| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Print a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(v: &T) -> Result<(), memplan::Error> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| memplan::Error::Measurement(format!("JSON encoding failed: {e}")))?;
    println!("{s}");
    Ok(())
}
