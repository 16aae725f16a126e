//! Engine graph capture: the private pool shared by every graph, exec overhead visible only to
//! the driver, allocation nodes in the graph-pool attributes, capture flushing the cache.

use memplan_core::{AllocatorView, Error};

use super::{free_after_sync, gpu, G, M};
use crate::GraphSpec;

#[test]
fn private_pool_is_shared_and_grows_to_the_largest_graph() {
    let g = gpu("h100-80gb");
    let a = g.allocator();
    let mut ids = Vec::new();
    for mib in [100u64, 80, 60, 40] {
        a.begin_graph_capture().unwrap();
        ids.push(
            a.end_graph_capture(&GraphSpec {
                kernel_nodes: 10,
                intermediate_bytes: mib * M,
                alloc_node_bytes: 0,
            })
            .unwrap(),
        );
    }
    let t = g.truth();
    let outputs: u64 = [100u64, 80, 60, 40].iter().map(|m| m * M / 16).sum();
    assert_eq!(
        t.private_pool_allocated, outputs,
        "only the outputs stay live"
    );
    assert!(
        t.private_pool_reserved < (100 + 80 + 60 + 40) * M,
        "not the sum: {}",
        t.private_pool_reserved
    );
    assert!(
        t.private_pool_reserved >= 100 * M,
        "at least the largest graph"
    );
    assert!(
        t.private_pool_reserved <= 100 * M + outputs + 8 * M,
        "max + outputs (+ rounding)"
    );
    assert_eq!(
        a.stats().reserved,
        t.private_pool_reserved,
        "allocator reserved includes the pool"
    );
    // empty_cache does not touch the private pool; destroying and releasing does.
    a.empty_cache();
    assert_eq!(g.truth().private_pool_reserved, t.private_pool_reserved);
    for id in ids {
        a.destroy_graph(id).unwrap();
    }
    a.release_private_pools().unwrap();
    assert_eq!(g.truth().private_pool_reserved, 0);
    assert_eq!(g.truth().graph_exec, 0);
}

#[test]
fn exec_overhead_is_visible_only_to_the_driver() {
    let g = gpu("rtx4090");
    let a = g.allocator();
    let before = free_after_sync(&g).unwrap();
    a.begin_graph_capture().unwrap();
    let id = a
        .end_graph_capture(&GraphSpec {
            kernel_nodes: 200,
            ..GraphSpec::default()
        })
        .unwrap();
    assert_eq!(a.stats().reserved, 0, "no allocator sees the exec object");
    let per_node = g.physics().exec_bytes_per_kernel_node;
    assert_eq!(free_after_sync(&g), Some(before - 200 * per_node));
    assert_eq!(g.truth().graph_exec, 200 * per_node);
    a.destroy_graph(id).unwrap();
    assert!(a.destroy_graph(id).is_err(), "already destroyed");
}

#[test]
fn alloc_nodes_show_in_graph_pool_attributes() {
    let g = gpu("a100-40gb");
    let a = g.allocator();
    a.begin_graph_capture().unwrap();
    let id = a
        .end_graph_capture(&GraphSpec {
            kernel_nodes: 1,
            intermediate_bytes: 0,
            alloc_node_bytes: 32 * M,
        })
        .unwrap();
    let gp = g.graph_pool_memory().unwrap();
    assert_eq!((gp.used, gp.reserved), (Some(32 * M), Some(32 * M)));
    assert_eq!(
        a.stats().reserved,
        0,
        "graph allocation nodes are not the allocator's"
    );
    a.destroy_graph(id).unwrap();
}

#[test]
fn allocations_inside_capture_go_to_the_private_pool() {
    let g = gpu("rtx4090");
    let a = g.allocator();
    a.begin_graph_capture().unwrap();
    let b = a.malloc(8 * M).unwrap();
    a.free(b).unwrap();
    let id = a.end_graph_capture(&GraphSpec::default()).unwrap();
    // A mid-sized request: a 20 MiB segment of the private pool.
    assert_eq!(g.truth().private_pool_reserved, 20 * M);
    assert_eq!(g.truth().allocator_reserved, 0);
    a.destroy_graph(id).unwrap();
    a.release_private_pools().unwrap();
    assert_eq!(g.truth().private_pool_reserved, 0);
}

#[test]
fn capture_is_exclusive_and_respects_support() {
    let g = gpu("rtx4090");
    let a = g.allocator();
    a.begin_graph_capture().unwrap();
    assert!(a.begin_graph_capture().is_err(), "one capture at a time");
    assert!(
        matches!(g.synchronize(), Err(Error::InvalidState { .. })),
        "sync during capture fails"
    );
    assert!(
        g.allocate(M).is_err(),
        "raw allocation during capture fails"
    );
    a.abort_graph_capture();
    assert!(g.synchronize().is_ok());
    let a770 = gpu("arc-a770").allocator();
    assert!(matches!(
        a770.begin_graph_capture(),
        Err(Error::Unsupported { .. })
    ));
    assert!(
        a.end_graph_capture(&GraphSpec::default()).is_err(),
        "nothing to end"
    );
}

#[test]
fn oom_during_capture_leaves_no_half_graph() {
    let g = gpu("l4");
    let a = g.allocator();
    g.set_other_processes(23 * 1024 * M);
    a.begin_graph_capture().unwrap();
    let spec = GraphSpec {
        kernel_nodes: 100_000,
        intermediate_bytes: 4 * M,
        alloc_node_bytes: 0,
    };
    assert!(matches!(
        a.end_graph_capture(&spec),
        Err(Error::OutOfMemory { .. })
    ));
    let t = g.truth();
    assert_eq!(
        (t.live_graphs, t.private_pool_allocated, t.graph_exec),
        (0, 0, 0)
    );
    assert!(
        a.begin_graph_capture().is_ok(),
        "the failed capture was ended"
    );
}

/// PyTorch's `release_cached_blocks` (c10/cuda/CUDACachingAllocator.cpp at commit 001074d2)
/// gives back the default pools' free blocks and those of private pools no graph uses any more
/// (`graph_pools_freeable`): a live graph's pool keeps its cached intermediates through a
/// failed allocation's retry, and gives them back once its graph is destroyed.
#[test]
fn a_failed_allocation_keeps_a_live_graphs_private_pool() {
    let g = gpu("l4");
    let a = g.allocator();
    a.begin_graph_capture().unwrap();
    let id = a
        .end_graph_capture(&GraphSpec {
            kernel_nodes: 10,
            intermediate_bytes: 12 * G,
            alloc_node_bytes: 0,
        })
        .unwrap();
    let pool = g.truth().private_pool_reserved;
    assert!(pool >= 12 * G, "the intermediates stay cached: {pool}");
    // 14 GiB fit beside the graph's output, not beside its cached intermediates.
    assert!(
        matches!(a.malloc(14 * G), Err(Error::OutOfMemory { .. })),
        "the live graph's pool is not given back"
    );
    assert_eq!(g.truth().private_pool_reserved, pool);
    a.destroy_graph(id).unwrap();
    let b = a.malloc(14 * G).unwrap();
    assert_eq!(
        g.truth().private_pool_reserved,
        0,
        "no graph uses the pool any more: the retry gives it back"
    );
    a.free(b).unwrap();
}

/// Inside a capture PyTorch's `malloc` gives back no cached segment but oversize ones of the
/// capture's own pool (`release_cached_blocks` only where `captures_underway` is empty;
/// c10/cuda/CUDACachingAllocator.cpp at commit 001074d2): a capture that does not fit beside
/// the default pool's cache fails, where the same allocation outside a capture fits.
#[test]
fn a_capture_that_does_not_fit_beside_the_cache_fails() {
    let g = gpu("l4,capture-empties-cache=off");
    let a = g.allocator();
    let b = a.malloc(12 * G).unwrap();
    a.free(b).unwrap(); // 12 GiB cached in the default pool
    a.begin_graph_capture().unwrap();
    let spec = GraphSpec {
        kernel_nodes: 10,
        intermediate_bytes: 14 * G,
        alloc_node_bytes: 0,
    };
    assert!(matches!(
        a.end_graph_capture(&spec),
        Err(Error::OutOfMemory { .. })
    ));
    assert_eq!(g.truth().allocator_reserved, 12 * G, "the cache stays");
    let c = a.malloc(14 * G).unwrap();
    assert_eq!(
        g.truth().allocator_reserved,
        14 * G,
        "outside a capture it goes"
    );
    a.free(c).unwrap();
}
