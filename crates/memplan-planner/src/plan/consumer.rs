//! What the budget subtracts before the KV cache: [`Consumer`]s, each a figure with its
//! [`Provenance`]. A measured start-up and a dry run both produce them; a figure the user gives
//! replaces one of either ([`Consumers::set`]), so measured, read and estimated figures mix.

use serde::{Deserialize, Deserializer, Serialize};

use crate::strategy::StrategyKind;

/// What a consumer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConsumerKind {
    /// Model weights (as the allocator holds them).
    Weights,
    /// The activation peak of a forward pass at the largest batch.
    Activation,
    /// Memory outside the engine's allocator that grows during start-up (context growth,
    /// library workspaces, communication buffers).
    NonAllocator,
    /// Memory graph capture takes (the graph reserve).
    Graphs,
}

impl ConsumerKind {
    /// Every kind, in the order plans list them.
    pub const ALL: [ConsumerKind; 4] = [
        ConsumerKind::Weights,
        ConsumerKind::Activation,
        ConsumerKind::NonAllocator,
        ConsumerKind::Graphs,
    ];

    /// The name in JSON and in refusals.
    pub fn name(self) -> &'static str {
        match self {
            ConsumerKind::Weights => "weights",
            ConsumerKind::Activation => "activation",
            ConsumerKind::NonAllocator => "non_allocator",
            ConsumerKind::Graphs => "graphs",
        }
    }

    /// The row label in the text rendering.
    pub fn label(self) -> &'static str {
        match self {
            ConsumerKind::Weights => "weights",
            ConsumerKind::Activation => "activation peak",
            ConsumerKind::NonAllocator => "non-allocator",
            ConsumerKind::Graphs => "graph reserve",
        }
    }

    /// The glyph of the memory bar.
    pub fn glyph(self) -> char {
        match self {
            ConsumerKind::Weights => 'W',
            ConsumerKind::Activation => 'A',
            ConsumerKind::NonAllocator => 'N',
            ConsumerKind::Graphs => 'G',
        }
    }

    /// The colour of the SVG picture.
    pub fn color(self) -> &'static str {
        match self {
            ConsumerKind::Weights => "#4e79a7",
            ConsumerKind::Activation => "#f28e2b",
            ConsumerKind::NonAllocator => "#e15759",
            ConsumerKind::Graphs => "#b07aa1",
        }
    }
}

impl std::fmt::Display for ConsumerKind {
    /// The label people read (`activation peak`); [`ConsumerKind::name`] is the JSON's.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Where a figure comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Provenance {
    /// Measured by a step of the measurement protocol in this start-up.
    Measured {
        /// The step (`load_weights`, `profile_run`, `graph_phase`, `whole start-up`).
        step: String,
        /// What was read.
        basis: String,
    },
    /// Read from a checkpoint's headers.
    Checkpoint {
        /// Which headers, how converted.
        basis: String,
    },
    /// Given by the user (a figure of an earlier start-up).
    Given {
        /// Where it comes from.
        basis: String,
    },
    /// Estimated, with its basis.
    Estimated {
        /// The basis (formula, default, bound).
        basis: String,
    },
    /// Graph memory measured or bounded by a graph strategy in this start-up.
    GraphStrategy {
        /// The strategy that ran.
        strategy: StrategyKind,
        /// How far the figure may be off, either way.
        uncertainty_bytes: u64,
        /// How it was obtained.
        basis: String,
    },
    /// Not subtracted in the budget, and why.
    NotReserved {
        /// Why.
        reason: String,
    },
}

impl Provenance {
    /// One word for tables: `measured`, `checkpoint`, `given`, `estimate`, `strategy`,
    /// `not reserved`.
    pub fn label(&self) -> &'static str {
        match self {
            Provenance::Measured { .. } => "measured",
            Provenance::Checkpoint { .. } => "checkpoint",
            Provenance::Given { .. } => "given",
            Provenance::Estimated { .. } => "estimate",
            Provenance::GraphStrategy { .. } => "strategy",
            Provenance::NotReserved { .. } => "not reserved",
        }
    }

    /// The basis or reason in words.
    pub fn basis(&self) -> &str {
        match self {
            Provenance::Measured { basis, .. }
            | Provenance::Checkpoint { basis }
            | Provenance::Given { basis }
            | Provenance::Estimated { basis }
            | Provenance::GraphStrategy { basis, .. } => basis,
            Provenance::NotReserved { reason } => reason,
        }
    }
}

/// One consumer: a figure and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Consumer {
    /// What it is.
    pub kind: ConsumerKind,
    /// Bytes per rank.
    pub bytes: u64,
    /// Where the figure comes from.
    pub provenance: Provenance,
}

impl Consumer {
    /// A consumer.
    pub fn new(kind: ConsumerKind, bytes: u64, provenance: Provenance) -> Self {
        Consumer {
            kind,
            bytes,
            provenance,
        }
    }

    /// Measured by a protocol step.
    pub fn measured(
        kind: ConsumerKind,
        bytes: u64,
        step: impl Into<String>,
        basis: impl Into<String>,
    ) -> Self {
        Self::new(
            kind,
            bytes,
            Provenance::Measured {
                step: step.into(),
                basis: basis.into(),
            },
        )
    }

    /// Given by the user.
    pub fn given(kind: ConsumerKind, bytes: u64, basis: impl Into<String>) -> Self {
        Self::new(
            kind,
            bytes,
            Provenance::Given {
                basis: basis.into(),
            },
        )
    }

    /// Estimated with a basis.
    pub fn estimated(kind: ConsumerKind, bytes: u64, basis: impl Into<String>) -> Self {
        Self::new(
            kind,
            bytes,
            Provenance::Estimated {
                basis: basis.into(),
            },
        )
    }

    /// Not reserved (0 bytes in the budget), and why.
    pub fn not_reserved(kind: ConsumerKind, reason: impl Into<String>) -> Self {
        Self::new(
            kind,
            0,
            Provenance::NotReserved {
                reason: reason.into(),
            },
        )
    }
}

/// The consumers of one rank, at most one per kind, in [`ConsumerKind::ALL`] order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Consumers(Vec<Consumer>);

impl Consumers {
    /// No consumers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a consumer, replacing the one of the same kind (a given figure overrides a measured
    /// or estimated one).
    pub fn set(&mut self, c: Consumer) -> &mut Self {
        match self.0.iter_mut().find(|x| x.kind == c.kind) {
            Some(x) => *x = c,
            None => {
                self.0.push(c);
                self.0.sort_by_key(|x| x.kind);
            }
        }
        self
    }

    /// The consumer of one kind.
    pub fn get(&self, kind: ConsumerKind) -> Option<&Consumer> {
        self.0.iter().find(|x| x.kind == kind)
    }

    /// Bytes of one kind (0 when absent).
    pub fn bytes(&self, kind: ConsumerKind) -> u64 {
        self.get(kind).map_or(0, |c| c.bytes)
    }

    /// Every consumer.
    pub fn iter(&self) -> impl Iterator<Item = &Consumer> {
        self.0.iter()
    }

    /// `(name, bytes)` of every consumer, for refusals.
    pub fn parts(&self) -> Vec<(String, u64)> {
        self.0
            .iter()
            .map(|c| (c.kind.name().to_string(), c.bytes))
            .collect()
    }

    /// The sum, or `None` on overflow.
    pub fn total(&self) -> Option<u64> {
        self.0.iter().try_fold(0u64, |a, c| a.checked_add(c.bytes))
    }
}

impl<'de> Deserialize<'de> for Consumers {
    /// A list of consumers, at most one per kind (a second of a kind is an error, not a
    /// silent replacement), kept in [`ConsumerKind::ALL`] order.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let list = Vec::<Consumer>::deserialize(d)?;
        let mut c = Consumers::new();
        for x in list {
            if c.get(x.kind).is_some() {
                return Err(serde::de::Error::custom(format!(
                    "two {} consumers",
                    x.kind.name()
                )));
            }
            c.set(x);
        }
        Ok(c)
    }
}

impl FromIterator<Consumer> for Consumers {
    fn from_iter<I: IntoIterator<Item = Consumer>>(iter: I) -> Self {
        let mut c = Consumers::new();
        for x in iter {
            c.set(x);
        }
        c
    }
}
