//! `MCP_BENCH_SMOKE=1` (set by the README's test command, `scripts/test.sh`): every bench runs
//! one short iteration at a tiny size, so that none rots between real runs. Its figures mean
//! nothing and nothing about them is asserted; a bench that panics fails the test command.

#![allow(dead_code)]

/// Whether this is a smoke run.
pub fn smoke() -> bool {
    std::env::var_os("MCP_BENCH_SMOKE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `full` normally, `tiny` in a smoke run.
pub fn scaled(full: usize, tiny: usize) -> usize {
    if smoke() {
        tiny
    } else {
        full
    }
}
