//! `MCP_BENCH_SMOKE=1` (set by the README's test command, `scripts/test.sh`): every bench runs
//! one short iteration at a tiny size, so that none rots between real runs. Its figures mean
//! nothing and nothing about them is asserted; a bench that panics fails the test command.

// Each bench includes this file and uses what it needs of it.
#![allow(dead_code, unused_imports)]

pub use mcp_core::testing::bench::{scaled, smoke};
