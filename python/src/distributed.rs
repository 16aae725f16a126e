//! `memplan._native.combine_plans`: the plans of every rank of a deployment, combined (the
//! facade's [`memplan::combine_json`]): every rank gets the fewest blocks of any; the combined
//! plan names the deployment, each rank's figures and the limiting rank. The Python side is
//! `memplan.distributed`.

use pyo3::prelude::*;

/// Combine `plans` (each a `memplan.plan/1` JSON text, one per rank): `(0, combined plan
/// JSON)`, or `(exit code, memplan.error/1 envelope)` exactly as `run_json` answers (a plan
/// that is not valid, of another version, or of another deployment is a usage error, 2). A
/// panic is the `internal` envelope ([`crate::guarded`]).
#[pyfunction]
pub fn combine_plans(py: Python<'_>, plans: Vec<String>) -> (u8, String) {
    crate::guarded(py, move || match memplan::combine_json(&plans) {
        Ok(p) => (0, p.to_json()),
        Err(e) => {
            let (code, mut json) = crate::errors::envelope(&e);
            // The command line words a combining error with the flag it would change
            // (`--tensor-parallel-size`, `--block-size`); no flag was passed here.
            if let memplan::Error::InvalidParam { message, .. } = e.root() {
                json["error"]["message"] = format!("combine: {message}").into();
            }
            (code, json.to_string())
        }
    })
}
