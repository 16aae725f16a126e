//! # level-zero-sys
//!
//! A minimal, documented FFI to the oneAPI Level Zero loader (`ze_api.h` core and `zes_api.h`
//! Sysman, spec 1.x): the types, constants, structs and functions a memory planner needs, and
//! nothing it does not.
//!
//! ## Contract
//!
//! - **Nothing is linked at build time.** [`LevelZero::load`] opens `libze_loader.so.1` with
//!   `libloading` and resolves each function, so this crate builds on any machine and a binary
//!   that uses it starts without the loader: a missing library or symbol is a [`LoadError`],
//!   never a panic or a link error.
//! - **Values from the library are integers, never Rust enums.** `ze_result_t` and every C
//!   enum are `u32` aliases with constants; a driver newer than this crate may return a value
//!   it does not know. [`result_name`] names the known result codes.
//! - **Struct layouts match the headers.** `tests/layout.rs` compiles a C program against the
//!   installed `level_zero/ze_api.h` and `zes_api.h` (Debian `libze-dev`) and compares the size
//!   and every field offset of each struct here.
//! - **Versions.** Spec 1.0 functions are required. `zeInitDrivers` (1.10) and `zesInit`,
//!   `zesDriverGet`, `zesDeviceGet` (1.5) are optional fields, `None` on older loaders (Debian
//!   bookworm ships loader 1.8.12 with 1.4 headers: no `zesInit`).
//!
//! ## Sysman
//!
//! Sysman (`zes*`) is reachable in two ways: `zesInit` (1.5+) gives its own driver/device
//! handles, matched to core devices by UUID; or the process is started with
//! `ZES_ENABLE_SYSMAN=1`, after which `zeInit` enables Sysman on core handles and a
//! `ze_device_handle_t` may be used as a `zes_device_handle_t`. This crate never sets
//! environment variables.
//!
//! Everything calling into the library is `unsafe`; the caller upholds the spec's rules.
#![allow(non_camel_case_types, non_snake_case)]

pub mod api;
pub mod result;
pub mod structs;
pub mod types;

pub use api::{api_major, api_minor, LevelZero, LoadError, LOADER_LIBRARY};
pub use result::*;
pub use structs::*;
pub use types::*;
