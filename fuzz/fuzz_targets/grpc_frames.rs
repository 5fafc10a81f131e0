//! A request body as HTTP/2 DATA frames, read as mcp-server reads a stream's requests: metered
//! (`request_body::MeteredBody`), split into gRPC messages and decoded by tonic, each applied
//! (`mcp_server::fuzzing::Stream::frames`, through the same `grpc::request_stream` and
//! `apply_request` the server runs), with a snapshot published.
//!
//! Input: a selector byte (bits 0-2: the RPC; bits 3-4: the snapshot, 3 = none), a count of
//! cuts (`% 16`) and that many cut lengths (bytes), then the body, cut into frames there.
//!
//! Invariants: no panic; framing changes nothing: when every message of the body is whole,
//! uncompressed and within `--max-request-size`, the stream applies exactly the messages a
//! stream fed them one by one applies (same acknowledgements, same responses); a message
//! declared over the limit ends the stream with RESOURCE_EXHAUSTED or OUT_OF_RANGE; and every
//! response passes the request targets' checks.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::io::{
    byte, flavour, limits, runtime, snapshots, take, StreamChecks, MAX_REQUEST_SIZE,
};
use mcp_server::engine::Ack;
use mcp_server::fuzzing::{Ended, Stream};

/// The body's messages as a reader of gRPC's framing sees them.
enum Walk<'a> {
    /// Every message whole, uncompressed, within the limit.
    Plain(Vec<&'a [u8]>),
    /// A prefix declaring more than the limit, after these messages.
    TooLarge(Vec<&'a [u8]>),
    /// Anything else (compressed, cut short): no expectation.
    Other,
}

fn walk(mut body: &[u8]) -> Walk<'_> {
    let mut msgs = Vec::new();
    while !body.is_empty() {
        if body.len() < 5 {
            return Walk::Other;
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        if len > MAX_REQUEST_SIZE {
            return Walk::TooLarge(msgs);
        }
        if body[0] != 0 || body.len() - 5 < len {
            return Walk::Other;
        }
        msgs.push(&body[5..5 + len]);
        body = &body[5 + len..];
    }
    Walk::Plain(msgs)
}

fuzz_target!(|data: &[u8]| {
    let mut data = data;
    let selector = byte(&mut data);
    let flavour = flavour(selector & 7);
    let snapshot = snapshots().get(usize::from((selector >> 3) & 3)).cloned();
    let count = usize::from(byte(&mut data) % 16);
    let cuts: Vec<usize> = take(&mut data, count)
        .iter()
        .map(|c| usize::from(*c) + 1)
        .collect();
    let body = data;
    let mut frames = Vec::new();
    let mut rest = body;
    for c in cuts {
        if rest.is_empty() {
            break;
        }
        frames.push(Bytes::copy_from_slice(take(&mut rest, c)));
    }
    if !rest.is_empty() {
        frames.push(Bytes::copy_from_slice(rest));
    }

    let mut checks = StreamChecks::new(flavour);
    checks.published.extend(snapshot.clone());
    let mut framed: Vec<(Ack, Option<(String, Vec<u8>)>)> = Vec::new();
    let mut stream = Stream::new(flavour, limits());
    let ended =
        runtime().block_on(
            stream.frames(frames, snapshot.as_ref(), &mut |engine, ack, sent| {
                if let Some(s) = &sent {
                    checks.sent(s);
                }
                checks.bounds(engine);
                framed.push((ack, sent.map(|s| (s.out.nonce, s.frame))));
            }),
        );

    match walk(body) {
        Walk::Plain(msgs) => {
            // The same messages, one by one.
            let mut one = Stream::new(flavour, limits());
            let mut direct = Vec::new();
            let mut direct_end = Ok(());
            for m in msgs {
                match one.request(m, snapshot.as_ref()) {
                    Ok((ack, sent)) => direct.push((ack, sent.map(|s| (s.out.nonce, s.frame)))),
                    Err(e) => {
                        direct_end = Err(e);
                        break;
                    }
                }
            }
            assert!(framed == direct, "framing changed what the stream did");
            match (&ended, &direct_end) {
                (Ok(()), Ok(())) => {}
                (Err(Ended::Refused(a)), Err(Ended::Refused(b))) => assert_eq!(a, b),
                // tonic reports a message that does not decode as a status.
                (Err(Ended::Status(_)), Err(Ended::Decode(_))) => {}
                (a, b) => panic!("framed: {a:?}, one by one: {b:?}"),
            }
        }
        Walk::TooLarge(before) => {
            assert!(framed.len() <= before.len());
            if framed.len() == before.len() {
                match &ended {
                    Err(Ended::Status(s)) => assert!(
                        matches!(
                            s.code(),
                            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
                        ),
                        "an oversized request ended the stream with {s:?}"
                    ),
                    Err(_) => {}
                    Ok(()) => panic!("a request over --max-request-size was taken"),
                }
            }
        }
        Walk::Other => {}
    }
});
