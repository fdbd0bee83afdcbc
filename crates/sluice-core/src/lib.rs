//! sluice-core
