//! Level Zero FFI (being built).
