//! Struct layouts and constants against the real headers (`level_zero/ze_api.h`,
//! `level_zero/zes_api.h` from Debian `libze-dev`): a C program prints `sizeof`, every
//! `offsetof` and every constant's value, and each must equal the Rust side. Skipped, with a message, only when the headers or `cc` are absent
//! (CI installs both). `ze_init_driver_type_desc_t` is newer than bookworm's headers; when the
//! headers lack it, it is checked against the spec's definition instead.

use level_zero_sys::*;
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

/// (C type, Rust size, [(C field, Rust offset)]).
type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

macro_rules! layout {
    ($t:ident { $($cf:ident => $rf:ident),* $(,)? }) => {
        (stringify!($t), size_of::<$t>(), vec![$((stringify!($cf), offset_of!($t, $rf))),*])
    };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!(ze_device_uuid_t { id => id }),
        layout!(ze_driver_uuid_t { id => id }),
        layout!(ze_driver_properties_t { stype => stype, pNext => pNext, uuid => uuid, driverVersion => driverVersion }),
        layout!(ze_device_properties_t {
            stype => stype, pNext => pNext, type => type_, vendorId => vendorId, deviceId => deviceId,
            flags => flags, subdeviceId => subdeviceId, coreClockRate => coreClockRate,
            maxMemAllocSize => maxMemAllocSize, maxHardwareContexts => maxHardwareContexts,
            maxCommandQueuePriority => maxCommandQueuePriority, numThreadsPerEU => numThreadsPerEU,
            physicalEUSimdWidth => physicalEUSimdWidth, numEUsPerSubslice => numEUsPerSubslice,
            numSubslicesPerSlice => numSubslicesPerSlice, numSlices => numSlices,
            timerResolution => timerResolution, timestampValidBits => timestampValidBits,
            kernelTimestampValidBits => kernelTimestampValidBits, uuid => uuid, name => name,
        }),
        layout!(ze_device_memory_properties_t {
            stype => stype, pNext => pNext, flags => flags, maxClockRate => maxClockRate,
            maxBusWidth => maxBusWidth, totalSize => totalSize, name => name,
        }),
        layout!(ze_context_desc_t { stype => stype, pNext => pNext, flags => flags }),
        layout!(ze_device_mem_alloc_desc_t { stype => stype, pNext => pNext, flags => flags, ordinal => ordinal }),
        layout!(ze_physical_mem_desc_t { stype => stype, pNext => pNext, flags => flags, size => size }),
        layout!(zes_device_properties_t {
            stype => stype, pNext => pNext, core => core, numSubdevices => numSubdevices,
            serialNumber => serialNumber, boardNumber => boardNumber, brandName => brandName,
            modelName => modelName, vendorName => vendorName, driverVersion => driverVersion,
        }),
        layout!(zes_mem_properties_t {
            stype => stype, pNext => pNext, type => type_, onSubdevice => onSubdevice,
            subdeviceId => subdeviceId, location => location, physicalSize => physicalSize,
            busWidth => busWidth, numChannels => numChannels,
        }),
        layout!(zes_mem_state_t { stype => stype, pNext => pNext, health => health, free => free, size => size }),
        layout!(zes_process_state_t {
            stype => stype, pNext => pNext, processId => processId, memSize => memSize,
            sharedSize => sharedSize, engines => engines,
        }),
    ]
}

/// Constants compared with the headers' values (every result code, plus the rest below).
fn constants() -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = RESULT_NAMES
        .iter()
        .map(|(c, n)| (*n, u64::from(*c)))
        .collect();
    macro_rules! c {
        ($($n:ident),*) => { $(v.push((stringify!($n), $n as u64));)* };
    }
    c!(
        ZE_INIT_FLAG_GPU_ONLY,
        ZE_DEVICE_TYPE_GPU,
        ZE_DEVICE_PROPERTY_FLAG_INTEGRATED,
        ZE_DEVICE_PROPERTY_FLAG_SUBDEVICE,
        ZE_DEVICE_PROPERTY_FLAG_ECC,
        ZE_DEVICE_PROPERTY_FLAG_ONDEMANDPAGING,
        ZE_MEMORY_ACCESS_ATTRIBUTE_NONE,
        ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE,
        ZES_MEM_LOC_SYSTEM,
        ZES_MEM_LOC_DEVICE,
        ZES_MEM_HEALTH_UNKNOWN,
        ZES_MEM_HEALTH_OK,
        ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES,
        ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES,
        ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES,
        ZE_STRUCTURE_TYPE_CONTEXT_DESC,
        ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
        ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC,
        ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES,
        ZES_STRUCTURE_TYPE_MEM_PROPERTIES,
        ZES_STRUCTURE_TYPE_MEM_STATE,
        ZES_STRUCTURE_TYPE_PROCESS_STATE,
        ZE_MAX_DEVICE_NAME,
        ZE_MAX_DEVICE_UUID_SIZE,
        ZE_MAX_DRIVER_UUID_SIZE,
        ZES_STRING_PROPERTY_SIZE
    );
    v
}

fn include_dir() -> Option<PathBuf> {
    ["/usr/include", "/usr/local/include"]
        .iter()
        .map(Path::new)
        .find(|d| {
            d.join("level_zero/ze_api.h").is_file() && d.join("level_zero/zes_api.h").is_file()
        })
        .map(Path::to_path_buf)
}

fn c_program(layouts: &[Layout], constants: &[(&str, u64)]) -> String {
    let mut s = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <level_zero/ze_api.h>\n#include <level_zero/zes_api.h>\nint main(void) {\n");
    for (t, _, fields) in layouts {
        s += &format!("  printf(\"{t} sizeof %zu\\n\", sizeof({t}));\n");
        for (f, _) in fields {
            s += &format!("  printf(\"{t} {f} %zu\\n\", offsetof({t}, {f}));\n");
        }
    }
    for (n, _) in constants {
        s += &format!("  printf(\"const {n} %llu\\n\", (unsigned long long)({n}));\n");
    }
    s + "  return 0;\n}\n"
}

#[test]
fn struct_layouts_match_the_headers() {
    let Some(inc) = include_dir() else {
        eprintln!(
            "SKIPPED: level_zero/ze_api.h not found (install libze-dev); layouts not checked"
        );
        return;
    };
    let layouts = layouts();
    let constants = constants();
    let dir = std::env::temp_dir().join(format!("level-zero-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program(&layouts, &constants)).expect("write C program");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = match Command::new(&cc)
        .arg("-I")
        .arg(&inc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: C compiler `{cc}` not runnable ({e}); layouts not checked");
            return;
        }
    };
    assert!(
        built.status.success(),
        "C layout program failed to build:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe).output().expect("run C layout program");
    let _ = std::fs::remove_dir_all(&dir);
    let c: BTreeMap<String, usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    let mut checked = 0;
    for (t, size, fields) in &layouts {
        assert_eq!(c.get(&format!("{t} sizeof")), Some(size), "sizeof({t})");
        for (f, off) in fields {
            assert_eq!(c.get(&format!("{t} {f}")), Some(off), "offsetof({t}, {f})");
            checked += 1;
        }
    }
    for (n, v) in &constants {
        assert_eq!(
            c.get(&format!("const {n}")).map(|x| *x as u64),
            Some(*v),
            "{n}"
        );
    }
    assert!(
        checked > 60 && constants.len() > 60,
        "only {checked} fields, {} constants compared",
        constants.len()
    );
}

#[test]
fn init_driver_type_desc_matches_the_spec() {
    // typedef struct { ze_structure_type_t stype; const void* pNext; ze_init_driver_type_flags_t flags; }
    assert_eq!(
        offset_of!(ze_init_driver_type_desc_t, pNext),
        size_of::<*const u8>()
    );
    assert_eq!(
        offset_of!(ze_init_driver_type_desc_t, flags),
        2 * size_of::<*const u8>()
    );
    assert_eq!(
        size_of::<ze_init_driver_type_desc_t>(),
        3 * size_of::<*const u8>()
    );
    let d = ze_init_driver_type_desc_t::new();
    assert_eq!(d.stype, ZE_STRUCTURE_TYPE_INIT_DRIVER_TYPE_DESC);
    assert!(d.pNext.is_null());
}
