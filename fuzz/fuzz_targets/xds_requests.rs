//! One stream of any RPC mcp-server serves (SotW and delta xDS, legacy MCP, the legacy
//! aggregated services), driven by a sequence of requests and snapshot changes: each request
//! decoded as tonic's prost codec decodes it and applied as the server applies it
//! (`mcp_server::fuzzing::Stream`, the same `apply_request` the server's streams run),
//! responses laid out as the server writes them.
//!
//! Input: a selector byte (the RPC), then operations, each a byte and its operands:
//! - `% 4 == 0`: a request, its length (2 bytes, little-endian) and that many bytes;
//! - `% 4 == 1`: publish snapshot `next byte % 3`;
//! - `% 4 == 2`: answer a response sent earlier (`next byte` picks it; bit 7: reject it);
//! - `% 4 == 3`: a made-up request for type `next byte % 6` (bit 3: name a resource; bit 4:
//!   incremental), nonce from the next byte.
//!
//! Invariants: no panic; a refused request ends the stream; responses carry only resources of
//! a published snapshot, with its version, fresh nonces, and frames that decode with the real
//! schema to the same; the stream stays within its limits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::io::{byte, flavour, limits, snapshots, take, Made, StreamChecks, TYPE_KEYS};
use mcp_server::fuzzing::{Sent, Stream};

fuzz_target!(|data: &[u8]| {
    let mut data = data;
    let flavour = flavour(byte(&mut data));
    let mut stream = Stream::new(flavour, limits());
    let mut checks = StreamChecks::new(flavour);
    let mut current = None;
    let mut sent: Vec<(String, String)> = Vec::new();
    let record = |checks: &mut StreamChecks, s: &Sent, sent: &mut Vec<(String, String)>| {
        checks.sent(s);
        sent.push((s.out.type_key.clone(), s.out.nonce.clone()));
    };
    let mut ops = 0;
    while !data.is_empty() && ops < 256 {
        ops += 1;
        let op = byte(&mut data);
        let msg = match op % 4 {
            0 => {
                let len = usize::from(u16::from_le_bytes([byte(&mut data), byte(&mut data)]));
                take(&mut data, len).to_vec()
            }
            1 => {
                let s = snapshots()[usize::from(byte(&mut data)) % 3].clone();
                checks.published.push(s.clone());
                for out in stream.snapshot(&s) {
                    record(&mut checks, &out, &mut sent);
                }
                current = Some(s);
                checks.bounds(stream.engine());
                continue;
            }
            2 => {
                let pick = byte(&mut data);
                let Some((type_key, nonce)) = sent
                    .iter()
                    .rev()
                    .nth(usize::from(pick & 0x7f) % sent.len().max(1))
                else {
                    continue;
                };
                Made {
                    type_key,
                    nonce,
                    error: pick & 0x80 != 0,
                    names: Vec::new(),
                    incremental: false,
                }
                .encode(flavour)
            }
            _ => {
                let pick = byte(&mut data);
                let nonce = byte(&mut data).to_string();
                let names = if pick & 8 != 0 {
                    vec!["shop/cart".to_string()]
                } else {
                    Vec::new()
                };
                Made {
                    type_key: TYPE_KEYS[usize::from(pick) % TYPE_KEYS.len()],
                    nonce: if nonce == "0" { "" } else { &nonce },
                    error: false,
                    names,
                    incremental: pick & 16 != 0,
                }
                .encode(flavour)
            }
        };
        match stream.request(&msg, current.as_ref()) {
            Ok((_, out)) => {
                if let Some(out) = out {
                    record(&mut checks, &out, &mut sent);
                }
            }
            // The server ends the stream with a status: nothing more is read.
            Err(_) => return,
        }
        checks.bounds(stream.engine());
    }
});
