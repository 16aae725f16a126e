//! Backend registration with `inventory`.
//!
//! Each backend crate submits one [`BackendRegistration`]. Because the linker drops a crate that
//! nothing references, the `memplan` facade references every compiled-in backend crate.

use crate::backend::{Backend, BackendKind};

/// One backend's registration.
#[non_exhaustive]
pub struct BackendRegistration {
    /// Which backend.
    pub kind: BackendKind,
    /// Create the backend object (cheap: must not load vendor libraries yet).
    pub create: fn() -> Box<dyn Backend>,
}

impl BackendRegistration {
    /// The registration of backend `kind`, created by `create`; `const`, for
    /// `inventory::submit!`.
    pub const fn new(kind: BackendKind, create: fn() -> Box<dyn Backend>) -> Self {
        Self { kind, create }
    }
}

inventory::collect!(BackendRegistration);

/// Every registered backend, ordered by kind.
pub fn registered() -> Vec<&'static BackendRegistration> {
    let mut v: Vec<_> = inventory::iter::<BackendRegistration>.into_iter().collect();
    v.sort_by_key(|r| r.kind);
    v.dedup_by_key(|r| r.kind);
    v
}
