//! Tests of the loader: the version-gating table and the no-driver path.

use super::*;

#[test]
fn version_gating_table() {
    let v = |x| CudaVersion(x);
    assert!(check_version(v(11000), Feature::Basic).is_ok());
    assert!(check_version(v(10020), Feature::Basic).is_err());
    assert!(check_version(v(10020), Feature::VirtualMemory).is_ok());
    for f in [Feature::Uuid, Feature::GraphMemory, Feature::GraphCapture] {
        assert!(check_version(v(11040), f).is_ok(), "{f:?}");
        assert!(check_version(v(12090), f).is_ok(), "{f:?}");
        let e = check_version(v(11020), f).unwrap_err();
        assert!(
            matches!(&e, Error::DriverTooOld { have, need, .. } if have == "11.2" && need == "11.4"),
            "{e}"
        );
    }
    let e = check_version(v(11020), Feature::GraphMemory)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cuDeviceGetGraphMemAttribute") && e.contains("11.2") && e.contains("11.4"),
        "{e}"
    );
}

#[test]
fn every_feature_lists_symbols() {
    for f in Feature::ALL {
        assert!(symbols(f).next().is_some(), "{f:?}");
        assert!(
            symbols(f)
                .all(|s| s.starts_with("cu")
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')),
            "{f:?}"
        );
    }
    assert!(symbols(Feature::GraphMemory).any(|s| s == "cuDeviceGetGraphMemAttribute"));
    assert_eq!(symbols(Feature::Basic).count(), 15);
}

#[test]
fn missing_library_is_a_typed_error() {
    let e = probe(&["libmemplan-no-such-driver.so.1".into()]).unwrap_err();
    assert!(matches!(e, Error::LibraryNotFound { .. }), "{e}");
    assert!(e.to_string().contains(canonical_name()), "{e}");
    #[cfg(target_os = "linux")]
    assert!(
        e.to_string()
            .contains("libmemplan-no-such-driver.so.1: cannot open"),
        "the loader's own words: {e}"
    );
    assert!(probe(&[]).is_err());
}

#[test]
fn candidates_include_the_runtime_name() {
    assert!(candidates().iter().any(|c| c == canonical_name()));
}

#[test]
fn load_never_panics_and_caches_its_outcome() {
    // Without a driver this is LibraryNotFound; with one it is a usable driver.
    match driver() {
        Ok(d) => assert!(d.version >= min_version(Feature::Basic)),
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::LibraryNotFound { .. }
                        | Error::DriverCall { .. }
                        | Error::DriverTooOld { .. }
                        | Error::MissingSymbol { .. }
                ),
                "{e}"
            );
            assert_eq!(driver().unwrap_err().to_string(), e.to_string());
        }
    }
}

/// Every driver symbol the backend calls is in the gating table, so no call can reach a
/// symbol the loader did not check, and every call goes through `ffi` (results read as
/// integers), never through cudarc's functions (an enum result, a panic on a missing symbol).
#[test]
fn every_called_symbol_is_gated() {
    let sources = [
        include_str!("backend.rs"),
        include_str!("device.rs"),
        include_str!("graph.rs"),
        include_str!("kernel.rs"),
        include_str!("vmm.rs"),
        include_str!("loader.rs"),
    ];
    let gated: Vec<&str> = Feature::ALL.iter().flat_map(|f| symbols(*f)).collect();
    let mut called = 0;
    for src in sources {
        for (i, _) in src.match_indices("sys::cu") {
            let rest = &src[i + 5..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                !rest[name.len()..].starts_with('('),
                "{name} is called through cudarc, not through ffi"
            );
        }
        for (i, _) in src.match_indices("ffi::cu") {
            let name: String = src[i + 5..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if src[i + 5 + name.len()..].starts_with('(') {
                called += 1;
                assert!(
                    gated.contains(&name.as_str()),
                    "{name} is called but not in loader::symbols"
                );
            }
        }
    }
    assert!(called > 30, "found only {called} calls: the scan is broken");
}
