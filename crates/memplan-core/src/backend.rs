//! Backends, device ids and descriptions.
//!
//! A [`Backend`] enumerates devices and opens them into a [`Device`]: the core's checked
//! device over the backend's raw primitives ([`crate::hal`]).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::device::Device;
use crate::error::{Error, Result};

/// How a backend's folder is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The standard backend folder (`docs/adding-a-backend.md`: `loader.rs`, `backend.rs`,
    /// `device.rs`, `capability.rs`, `facts.rs`, `graph.rs`, `vmm.rs`, `conv.rs`).
    Hal,
    /// The simulator: its own layout (profiles, physics, quirks).
    Simulator,
}

/// What the one list ([`crate::backend_list!`]) says about a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendInfo {
    /// Which backend.
    pub kind: BackendKind,
    /// The id prefix (`cuda` in `cuda:0`) and serde name.
    pub name: &'static str,
    /// Other prefixes accepted when parsing an id (`hip`).
    pub aliases: &'static [&'static str],
    /// The `memplan` facade's cargo feature that compiles it in.
    pub feature: &'static str,
    /// Its crate, as a Rust path (`memplan_backend_cuda`).
    pub krate: &'static str,
    /// Vendor libraries it loads at run time (never NEEDED by a binary).
    pub libraries: &'static [&'static str],
    /// How its folder is laid out.
    pub layout: Layout,
    /// A device CI can open without hardware, on which the conformance suite runs.
    pub ci_device: Option<&'static str>,
    /// One line that says what it is.
    pub description: &'static str,
}

impl BackendInfo {
    /// The package name (`memplan-backend-cuda`).
    pub fn package(&self) -> String {
        self.krate.replace('_', "-")
    }

    /// Its folder, relative to the repository root (`backends/cuda`).
    pub fn folder(&self) -> String {
        format!("backends/{}", self.name)
    }

    /// What its device ids look like, for messages (an unknown device's `available`): the
    /// simulator names a profile (`sim:rtx4090`, `sim:h100-80gb,seed=3`), every other backend
    /// selects by ordinal (`cuda:0`). The simulator's profiles are its own crate's: listed by
    /// the facade's `memplan::parse_device_id`, shown here by example and where to list them.
    pub fn id_form(&self) -> String {
        let name = self.name;
        match self.layout {
            Layout::Simulator => format!(
                "{name}:PROFILE with optional ,modifiers (PROFILE a simulated GPU, e.g. `{}`; \
                 `memplan devices` lists them)",
                self.example_id()
            ),
            Layout::Hal => format!("{name}:N with N a device ordinal (e.g. `{name}:0`)"),
        }
    }

    /// An example device id (`cuda:0`; the CI device where it has one).
    pub fn example_id(&self) -> String {
        self.ci_device
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}:0", self.name))
    }
}

macro_rules! layout {
    (hal) => {
        Layout::Hal
    };
    (simulator) => {
        Layout::Simulator
    };
}

macro_rules! ci_device {
    ("") => {
        None
    };
    ($d:literal) => {
        Some($d)
    };
}

/// Generates [`BackendKind`] and its [`BackendInfo`]s from the one list.
macro_rules! define_backend_kind {
    ($(
        $variant:ident {
            name: $name:literal,
            aliases: [$($alias:literal),*],
            feature: $feature:literal,
            krate: $krate:ident,
            libraries: [$($lib:literal),*],
            layout: $layout:ident,
            ci_device: $ci:tt,
            description: $desc:literal,
        }
    )*) => {
        /// Every backend memplan knows, compiled in or not (so every name parses in every
        /// build), generated from the one list ([`crate::backend_list!`]):
        ///
        /// | backend | `memplan` feature | crate | what |
        /// |---|---|---|---|
        $(
            #[doc = concat!("| `", $name, "` | `", $feature, "` | `", stringify!($krate), "` | ", $desc, " |")]
        )*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum BackendKind {
            $(
                #[doc = $desc]
                #[serde(rename = $name)]
                $variant,
            )*
        }

        impl BackendKind {
            /// How many backends the list declares.
            pub const COUNT: usize = [$(BackendKind::$variant),*].len();

            /// Every backend, in the list's order.
            pub const ALL: [BackendKind; BackendKind::COUNT] = [$(BackendKind::$variant),*];

            /// What the list says about it.
            pub fn info(self) -> &'static BackendInfo {
                match self {
                    $(
                        BackendKind::$variant => &BackendInfo {
                            kind: BackendKind::$variant,
                            name: $name,
                            aliases: &[$($alias),*],
                            feature: $feature,
                            krate: stringify!($krate),
                            libraries: &[$($lib),*],
                            layout: layout!($layout),
                            ci_device: ci_device!($ci),
                            description: $desc,
                        },
                    )*
                }
            }
        }
    };
}

crate::backend_list!(define_backend_kind);

impl BackendKind {
    /// The name used in device ids (`cuda:0`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The cargo feature of the `memplan` facade that compiles it in.
    pub fn feature(self) -> &'static str {
        self.info().feature
    }

    /// Every backend's name, comma separated (for messages and help).
    pub fn names() -> String {
        BackendKind::ALL.map(|k| k.name()).join(", ")
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let l = s.to_ascii_lowercase();
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == l || k.info().aliases.contains(&l.as_str()))
            .ok_or_else(|| Error::UnknownBackend {
                name: s.to_string(),
                known: BackendKind::names(),
            })
    }
}

/// A device id: `backend:selector`, e.g. `cuda:0`, `sim:rtx4090`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceId {
    /// The backend.
    pub backend: BackendKind,
    /// Backend-specific selector: an ordinal for real backends, a profile name for `sim`.
    pub selector: String,
}

impl DeviceId {
    /// A device id.
    pub fn new(backend: BackendKind, selector: impl Into<String>) -> Self {
        DeviceId {
            backend,
            selector: selector.into(),
        }
    }

    /// The selector as an ordinal, or an `UnknownDevice` error.
    pub fn ordinal(&self) -> Result<usize> {
        self.selector.parse().map_err(|_| Error::UnknownDevice {
            id: self.to_string(),
            available: self.backend.info().id_form(),
        })
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.selector)
    }
}

impl FromStr for DeviceId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (b, sel) = s
            .split_once(':')
            .map_or((s, None), |(b, sel)| (b, Some(sel)));
        let backend: BackendKind = b.parse()?;
        // The simulator names its devices (`sim:rtx4090,other=1GiB`); every other backend
        // selects one by its ordinal, in decimal digits (`cuda:0`).
        let ordinal = |sel: &str| {
            !sel.is_empty()
                && sel.bytes().all(|b| b.is_ascii_digit())
                && sel.parse::<usize>().is_ok()
        };
        let named = backend.info().layout == Layout::Simulator;
        // A hardware id without a selector is its first device (`cuda` is `cuda:0`); the
        // simulator has no first profile, so `sim` alone is refused as itself (not as a
        // `sim:0` nobody typed).
        let sel = match sel {
            Some(sel) => sel,
            None if named => "",
            None => "0",
        };
        if sel.is_empty() || !(named || ordinal(sel)) {
            return Err(Error::UnknownDevice {
                id: s.into(),
                available: backend.info().id_form(),
            });
        }
        Ok(DeviceId::new(backend, sel))
    }
}

/// Static description of a device, as enumerated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeviceDescriptor {
    /// Its id.
    pub id: DeviceId,
    /// Marketing name as the driver reports it.
    pub name: String,
    /// Total memory as the driver reports it, when it could be read.
    pub total_bytes: Option<u64>,
    /// Free-form facts (compute capability, gfx arch, driver/runtime version, MIG, UUID...).
    pub properties: Vec<(String, String)>,
}

impl DeviceDescriptor {
    /// A descriptor with no properties.
    pub fn new(id: DeviceId, name: impl Into<String>, total_bytes: Option<u64>) -> Self {
        Self {
            id,
            name: name.into(),
            total_bytes,
            properties: Vec::new(),
        }
    }

    /// The same descriptor with `properties` in place of its properties.
    pub fn with_properties(mut self, properties: Vec<(String, String)>) -> Self {
        self.properties = properties;
        self
    }

    /// The same descriptor with one more property.
    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }
}

/// Whether a compiled-in backend can run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum BackendStatus {
    /// It loaded and can enumerate devices.
    Available,
    /// It cannot run here; `reason` names the library, the call and what it returned.
    Unavailable {
        /// Why not.
        reason: String,
    },
}

/// A backend: one vendor API.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Load the vendor library and enumerate devices. Never panics: a missing library or a
    /// failing init call is an `Err` naming the library, the call and the returned code.
    /// Cost: loads libraries on first call; cheap afterwards.
    fn devices(&self) -> Result<Vec<DeviceDescriptor>>;

    /// Open a device by selector (ordinal, or profile name for `sim`): the backend's
    /// [`HalDevice`](crate::hal::HalDevice) wrapped in the core's [`Device`] (`Device::new`).
    fn open(&self, selector: &str) -> Result<Device>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ids() {
        let d: DeviceId = "sim:rtx4090".parse().unwrap();
        assert_eq!(d.backend, BackendKind::Sim);
        assert_eq!(d.selector, "rtx4090");
        let c: DeviceId = "cuda".parse().unwrap();
        assert_eq!(c.to_string(), "cuda:0");
        assert_eq!(c.ordinal().unwrap(), 0);
        assert_eq!(
            "HIP:1".parse::<DeviceId>().unwrap().backend,
            BackendKind::Rocm
        );
        let e = "metal:0".parse::<DeviceId>().unwrap_err().to_string();
        assert!(
            e.contains("unknown backend `metal`") && e.contains("cuda"),
            "{e}"
        );
        assert!("cuda:".parse::<DeviceId>().is_err());
    }

    /// Every backend but the simulator selects a device by its ordinal: anything else is no
    /// device id (refused where it is parsed, also where the device is never opened, as
    /// beside `--total-memory`), not an id that fails later or not at all.
    #[test]
    fn a_hardware_id_needs_an_ordinal() {
        for bad in [
            "cuda:x",
            "cuda:-1",
            "cuda:+1",
            "cuda: 1",
            "cuda:1.0",
            "cuda:99999999999999999999999",
            "hip:0x1",
            "xpu:first",
            "template:\u{0661}",
        ] {
            let e = bad.parse::<DeviceId>().expect_err(bad);
            assert!(matches!(e, Error::UnknownDevice { .. }), "{bad}: {e:?}");
            assert!(e.to_string().contains(bad), "{bad}: {e}");
        }
        for good in [
            "cuda:0",
            "rocm:7",
            "xpu:1",
            "template:0",
            "sim:rtx4090,other=1GiB",
        ] {
            good.parse::<DeviceId>().expect(good);
        }
        assert_eq!("cuda:3".parse::<DeviceId>().unwrap().ordinal().unwrap(), 3);
    }

    /// The error of an id without a selector says what that backend's ids look like: a
    /// profile name for the simulator (never "a device ordinal", which it does not take), an
    /// ordinal for the others.
    #[test]
    fn an_unknown_device_says_what_its_backend_takes() {
        let e = "sim".parse::<DeviceId>().unwrap_err().to_string();
        assert!(
            e.contains("`sim`") && e.contains("sim:PROFILE") && !e.contains("sim:0"),
            "{e}"
        );
        let e = "sim:".parse::<DeviceId>().unwrap_err().to_string();
        assert!(
            e.contains("`sim:`")
                && e.contains("sim:PROFILE")
                && e.contains("`sim:rtx4090`")
                && !e.contains("ordinal"),
            "{e}"
        );
        for bad in ["cuda:", "cuda:x", "hip:first"] {
            let e = bad.parse::<DeviceId>().unwrap_err().to_string();
            assert!(
                e.contains("a device ordinal") && e.contains(":0`"),
                "{bad}: {e}"
            );
        }
    }

    /// The text xtask reads (`backends.rs`, parsed by `backend_list_format.rs`) says what the
    /// enum says, entry by entry, and every name, alias and serde name parses back.
    #[test]
    fn the_list_xtask_reads_is_the_enum() {
        let parsed = crate::backend_list_format::parse(include_str!("backends.rs"))
            .expect("the list parses");
        assert_eq!(parsed.len(), BackendKind::COUNT);
        for (e, k) in parsed.iter().zip(BackendKind::ALL) {
            let i = k.info();
            assert_eq!(e.variant, format!("{k:?}"));
            assert_eq!(
                (e.name.as_str(), e.feature.as_str(), e.krate.as_str()),
                (i.name, i.feature, i.krate)
            );
            assert_eq!(e.aliases, i.aliases);
            assert_eq!(e.libraries, i.libraries);
            assert_eq!(e.description, i.description);
            assert_eq!(e.ci_device.is_empty(), i.ci_device.is_none());
            assert_eq!(e.package(), i.package());
            assert_eq!(i.kind, k);
            assert_eq!(k.name().parse::<BackendKind>().unwrap(), k);
            for a in i.aliases {
                assert_eq!(a.parse::<BackendKind>().unwrap(), k);
            }
            assert_eq!(
                serde_json::to_value(k).unwrap(),
                serde_json::json!(k.name())
            );
            assert!(i
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        }
        let mut names: Vec<&str> = BackendKind::ALL
            .iter()
            .flat_map(|k| std::iter::once(k.name()).chain(k.info().aliases.iter().copied()))
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name or alias is declared twice");
    }

    #[test]
    fn a_malformed_list_is_an_error_naming_the_line() {
        let src = include_str!("backends.rs");
        let broken = src.replacen("feature: \"cuda\",", "feature: \"cuda\"", 1);
        let e = crate::backend_list_format::parse(&broken).unwrap_err();
        assert!(e.contains("line") && e.contains("comma"), "{e}");
        let swapped = src.replacen(
            "                aliases: [],\n                feature: \"sim\",",
            "                feature: \"sim\",\n                aliases: [],",
            1,
        );
        let e = crate::backend_list_format::parse(&swapped).unwrap_err();
        assert!(e.contains("Sim") && e.contains("in that order"), "{e}");
    }
}
