//! The planner's session on a simulated device: arithmetic on absurd engine figures.
//! (Moved from `memplan-planner`, which depends on no backend.)

use memplan_backend_sim::SimGpu;
use memplan_core::{AllocatorStats, AllocatorView, Result};
use memplan_planner::strategy::NoGraphs;
use memplan_planner::{Engine, Session};

/// An engine whose allocator view reports whatever the test sets (a broken engine).
struct Liar(AllocatorStats);

impl AllocatorView for Liar {
    fn stats(&self) -> AllocatorStats {
        self.0
    }
    fn release_cached(&mut self) -> Result<()> {
        Ok(())
    }
    fn reset_peak(&mut self) {}
}

impl Engine for Liar {
    fn allocator(&mut self) -> &mut dyn AllocatorView {
        self
    }
    fn graph_sizes(&self) -> Vec<u32> {
        Vec::new()
    }
    fn capture_graph(&mut self, _size: u32) -> Result<()> {
        Ok(())
    }
    fn release_graphs(&mut self) -> Result<()> {
        // Teardown "gives back" an absurd amount once more.
        self.0.reserved = 0;
        Ok(())
    }
}

#[test]
fn absurd_allocator_figures_saturate_instead_of_wrapping() {
    let gpu = SimGpu::open("rtx4090").unwrap().device();
    let cap = gpu.capabilities().clone();
    let mut e = Liar(AllocatorStats::new(u64::MAX, 0, 0));
    let mut s = Session::begin(&gpu, &mut e, cap).unwrap();
    s.load_weights(|e| {
        e.0.reserved = 0;
        Ok(())
    })
    .unwrap();
    s.profile_run(|e| {
        e.0.reserved = u64::MAX;
        Ok(())
    })
    .unwrap();
    s.graph_phase(&NoGraphs, "test").unwrap();
    let (p, _) = s.into_parts();
    // Two steps of about i64::MAX each: saturated, and still positive (a wrapped sum
    // would be negative and read as no growth at all).
    assert_eq!(p.non_allocator_growth, Some(i64::MAX));
}
