//! Closing an idle HTTP/2 connection with a GOAWAY from outside hyper: tonic serves each
//! connection on its own task and offers no way to shut one down gracefully, but what the
//! server reads is ours ([`crate::conn::Conn`]). Read in between two of the peer's frames, a
//! GOAWAY looks to the server as if the peer sent it.

/// A client's HTTP/2 GOAWAY (NO_ERROR, no stream of the server's processed): read by the
/// server as if the client sent it, it answers with its own GOAWAY naming the last stream it
/// processed and closes once no stream is open. A client that opened a stream in that instant
/// learns it was not processed (and may retry it: grpc-go does so by itself), where a plain
/// close would fail it.
pub(crate) const GOAWAY: [u8; 17] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// The HTTP/2 client preface's length.
pub(crate) const PREFACE: usize = 24;

/// Follows the peer's HTTP/2 frames as they are read, so that a GOAWAY can be read in between
/// two of them.
#[derive(Debug, Default)]
pub(crate) struct FrameTrack {
    /// Bytes of the preface (then of frames) seen.
    seen: usize,
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes of the current frame still to come.
    payload: usize,
}

impl FrameTrack {
    /// Follows `b`, the next bytes read from the peer.
    pub(crate) fn scan(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            if self.seen < PREFACE {
                let n = (PREFACE - self.seen).min(b.len());
                self.seen += n;
                b = &b[n..];
            } else if self.payload > 0 {
                let n = self.payload.min(b.len());
                self.payload -= n;
                b = &b[n..];
            } else {
                let n = (9 - self.head_len).min(b.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&b[..n]);
                self.head_len += n;
                b = &b[n..];
                if self.head_len == 9 {
                    self.head_len = 0;
                    self.payload =
                        u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]) as usize;
                }
            }
        }
    }

    /// Whether the preface and every frame begun were read whole.
    pub(crate) fn between_frames(&self) -> bool {
        self.seen >= PREFACE && self.head_len == 0 && self.payload == 0
    }
}
