//! The capability this backend declares, from facts only ([`TemplateFacts`]): pure data and
//! functions, unit-tested without a device, and run by the capability matrix
//! ([`platforms`]). Calibration in the planner confirms or downgrades it on the device; the
//! conformance suite checks every line on the device.
//!
//! The rules, each with its reason:
//! - total: `fake_mem_get_info` reports the device's memory: exact.
//! - free: `fake_mem_get_info` counts what this process holds, exactly; the device lives in
//!   this process, so another process (which loads its own runtime) is invisible: declared
//!   process-local, tolerance 0. A real driver whose free counts every process declares
//!   `Exact`; the suite's second process tells the two apart.
//! - device-wide reading: none (the runtime has no counter of other processes).
//! - graph capture and graph-pool attributes: from runtime 2.0 with attribute 2.
//! - virtual memory: attribute 1.
//! - synchronize: `fake_synchronize` waits for everything (work runs synchronously).

use memplan_core::{ProfilingCapability, Reading, Reliability, Support};

use crate::facts::{TemplateFacts, Version};

/// The first runtime with stream capture and graph-pool attributes.
pub const CAPTURE_SINCE: Version = Version(2000);

fn attribute(value: Option<bool>, what: &str) -> Support {
    match value {
        Some(true) => Support::Supported,
        Some(false) => Support::no(format!("the device reports {what} = 0")),
        None => Support::no(format!("{what} could not be read")),
    }
}

// guide:begin declare
/// The capability declared for a device with these facts.
pub fn declare(f: &TemplateFacts) -> ProfilingCapability {
    let mut cap = ProfilingCapability::exact_discrete();
    cap.notes
        .push(format!("fake runtime {}", f.runtime_version));
    cap.set(
        Reading::DriverFree,
        Reliability::process_local(
            0,
            "fake_mem_get_info counts this process: the device lives in it, and another process loads a device of its own",
        ),
    );
    cap.set(
        Reading::DeviceAvailable,
        Reliability::Unavailable {
            reason: "the fake runtime has no device-wide counter".into(),
        },
    );
    let capture = if f.runtime_version < CAPTURE_SINCE {
        Support::no(format!(
            "runtime {} has no stream capture (needs {CAPTURE_SINCE})",
            f.runtime_version
        ))
    } else {
        attribute(f.graph_capture_attribute, "the stream-capture attribute")
    };
    if let Support::Unsupported { reason } = &capture {
        cap.set(
            Reading::GraphPool,
            Reliability::Unavailable {
                reason: reason.clone(),
            },
        );
    }
    cap.facts.graph_pool_attributes = capture.clone();
    cap.facts.graph_capture = capture;
    cap.facts.virtual_memory =
        attribute(f.virtual_memory_attribute, "the virtual-memory attribute");
    cap
}
// guide:end declare

/// The platforms this backend's rows of the capability matrix show
/// (`docs/capability-matrix.md`): representative facts run through [`declare`].
pub fn platforms() -> Vec<(&'static str, ProfilingCapability)> {
    let current = TemplateFacts {
        runtime_version: Version(2010),
        virtual_memory_attribute: Some(true),
        graph_capture_attribute: Some(true),
    };
    let old = TemplateFacts {
        runtime_version: Version(1050),
        virtual_memory_attribute: Some(false),
        ..current.clone()
    };
    vec![
        ("fake runtime 2.1", declare(&current)),
        (
            "fake runtime 1.5 (no capture, no virtual memory)",
            declare(&old),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_runtime_declares_capture_and_virtual_memory() {
        let c = &platforms()[0].1;
        assert!(c.facts.graph_capture.is_supported() && c.facts.virtual_memory.is_supported());
        assert!(c.reading(Reading::GraphPool).is_exact());
        assert!(!c.reading(Reading::DriverFree).sees_whole_device());
        assert!(c.reading(Reading::DriverFree).measures_own_usage());
    }

    #[test]
    fn an_old_runtime_says_why_it_cannot_capture() {
        let c = &platforms()[1].1;
        let Support::Unsupported { reason } = &c.facts.graph_capture else {
            panic!("capture declared on runtime 1.5");
        };
        assert!(reason.contains("needs 2.0"), "{reason}");
        assert!(!c.reading(Reading::GraphPool).measures_own_usage());
        assert!(!c.facts.virtual_memory.is_supported());
    }

    #[test]
    fn an_unreadable_attribute_is_not_support() {
        let f = TemplateFacts {
            runtime_version: Version(2010),
            virtual_memory_attribute: None,
            graph_capture_attribute: Some(true),
        };
        let c = declare(&f);
        assert!(c
            .facts
            .virtual_memory
            .to_string()
            .contains("could not be read"));
    }
}
