//! sluice-server
