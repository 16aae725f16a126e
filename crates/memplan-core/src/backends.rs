//! **The one list of backends.** Every backend memplan knows is declared here once: its name
//! (the id prefix, `cuda` in `cuda:0`), the other names its ids accept, the `memplan` facade's
//! cargo feature that compiles it in, its crate, the vendor libraries it loads at run time,
//! the layout of its folder, the device CI runs the conformance suite on (if any) and one line
//! that says what it is.
//!
//! Everything else is derived from this list: [`BackendKind`](crate::BackendKind) and its
//! parsing and serde names, the facade's references that keep each backend's registration
//! linked, the facade's pure declarations (the capability matrix), the CLI's messages and help,
//! the README's backend table, the architecture tests, and xtask's conformance command,
//! dependency rules and linkage check. xtask is std-only and reads this file as text
//! (`xtask/src/backends.rs`, with the parser in `backend_list_format.rs` that a test of this
//! crate also runs), so keep the format: one backend per block, one field per line, in this
//! order.
//!
//! Fields:
//! - `name`: the id prefix and the serde name; lower case.
//! - `aliases`: other prefixes accepted when parsing an id (`hip:0`).
//! - `feature`: the `memplan` crate's feature that compiles it in (turning on its crate's
//!   `register` feature).
//! - `krate`: its crate, as a Rust path (`memplan_backend_cuda`; the package name uses `-`),
//!   in folder `backends/<name>`.
//! - `libraries`: the vendor libraries it loads at run time; none may be a NEEDED entry of a
//!   binary (`cargo xtask linkage`).
//! - `layout`: `hal` (the standard backend folder, `docs/adding-a-backend.md`) or `simulator`.
//! - `ci_device`: a device CI can open without hardware, on which the conformance suite runs
//!   (`""` when there is none).
//! - `description`: one line for tables and help.

/// Expands to `$then! { ... }` with every backend's entry (see the module docs for the fields):
/// the one list, which every other list of backends is made from.
#[macro_export]
macro_rules! backend_list {
    ($then:ident) => {
        $then! {
            Sim {
                name: "sim",
                aliases: [],
                feature: "sim",
                krate: memplan_backend_sim,
                libraries: [],
                layout: simulator,
                ci_device: "sim:rtx4090",
                description: "Simulated GPUs that reproduce each vendor's memory behaviour; no hardware needed",
            }
            Cuda {
                name: "cuda",
                aliases: [],
                feature: "cuda",
                krate: memplan_backend_cuda,
                libraries: ["libcuda", "libnvidia-ml", "libnvrtc"],
                layout: hal,
                ci_device: "",
                description: "NVIDIA GPUs through the CUDA driver API, loaded at run time",
            }
            Rocm {
                name: "rocm",
                aliases: ["hip"],
                feature: "rocm",
                krate: memplan_backend_rocm,
                libraries: ["libamdhip64", "libhsa-runtime"],
                layout: hal,
                ci_device: "",
                description: "AMD GPUs and APUs through the HIP runtime, loaded at run time",
            }
            Xpu {
                name: "xpu",
                aliases: ["level-zero"],
                feature: "xpu",
                krate: memplan_backend_xpu,
                libraries: ["libze_loader"],
                layout: hal,
                ci_device: "",
                description: "Intel GPUs through Level Zero, loaded at run time",
            }
            // guide:begin list-entry
            Template {
                name: "template",
                aliases: [],
                feature: "template",
                krate: memplan_backend_template,
                libraries: [],
                layout: hal,
                ci_device: "template:0",
                description: "A complete minimal backend over an in-process fake runtime: the starting point of a new backend",
            }
            // guide:end list-entry
        }
    };
}
