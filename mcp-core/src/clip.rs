//! Texts quoted from elsewhere (a registry's error body, an API server's message) cut to a length
//! that a probe answer, a log line or a debug page can carry.
//!
//! A registry behind a proxy can answer an error with a whole HTML page, and an admission webhook
//! can quote a whole object back: kept as they come, one such answer makes every `/readyz` probe
//! and every log line that quotes it that large. Where an error text is stored for the admin
//! endpoints it goes through [`clip_error`]; the start (what failed, the status) is what people
//! read, so the tail is cut, and a marker says how much.

use std::borrow::Cow;

/// Most bytes of an error text kept for `/readyz`, `/registryz`, `/debug/resources` and logs
/// (before the marker).
pub const ERROR_TEXT_MAX: usize = 512;

/// Most bytes of a registry answer's body quoted inside an error message, so that the message
/// around it (what was asked, the status) stays within [`ERROR_TEXT_MAX`] and its marker tells
/// the body's real size.
pub const QUOTED_BODY_MAX: usize = 256;

/// A registry answer's body for an error message: lossy UTF-8, trimmed, cut to
/// [`QUOTED_BODY_MAX`] with a marker.
pub fn quoted_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    clip(text.trim(), QUOTED_BODY_MAX).into_owned()
}

/// `s` cut to at most `max` bytes (on a character boundary) followed by ` …[N bytes cut]`, or `s`
/// itself when it fits.
pub fn clip(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{} …[{} bytes cut]", &s[..end], s.len() - end))
}

/// An owned error text cut to [`ERROR_TEXT_MAX`] (the text itself when it fits: no copy).
pub fn clip_error(s: String) -> String {
    match clip(&s, ERROR_TEXT_MAX) {
        Cow::Borrowed(_) => s,
        Cow::Owned(cut) => cut,
    }
}

/// An error and every `source()` below it, joined by `: ` (what `{:#}` prints for anyhow): the
/// cause that says what to fix is usually the innermost one (a refused connection under a
/// "transport error").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let text = inner.to_string();
        // Some errors repeat their source in their own message; say it once.
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = inner.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_are_kept_and_long_ones_cut_with_a_marker() {
        assert_eq!(
            clip("consul said: ACL not found", 512),
            "consul said: ACL not found"
        );
        let body = format!("HTTP 502: {}", "<p>bad gateway</p>".repeat(100_000));
        let cut = clip_error(body.clone());
        assert!(cut.starts_with("HTTP 502: <p>bad gateway</p>"), "{cut}");
        assert!(cut.len() < ERROR_TEXT_MAX + 32, "{}", cut.len());
        assert!(
            cut.ends_with(&format!(" …[{} bytes cut]", body.len() - ERROR_TEXT_MAX)),
            "{cut}"
        );
    }

    #[test]
    fn a_quoted_body_leaves_room_for_the_message_around_it() {
        let body = vec![b'x'; 1 << 20];
        let q = quoted_body(&body);
        assert!(
            q.ends_with(&format!(" …[{} bytes cut]", (1 << 20) - QUOTED_BODY_MAX)),
            "{q}"
        );
        let message = format!("consul answered /v1/catalog/services with HTTP 500: {q}");
        assert_eq!(clip_error(message.clone()), message, "fits: not cut twice");
        assert_eq!(
            quoted_body(b"  No path to datacenter\n"),
            "No path to datacenter"
        );
    }

    #[test]
    fn cuts_on_a_character_boundary() {
        // 'é' is two bytes: byte 5 is inside the third one.
        let cut = clip("ééééé", 5);
        assert_eq!(cut, "éé …[6 bytes cut]");
    }

    #[test]
    fn error_chains() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        assert_eq!(error_chain(&e), "transport error: connection refused");
    }
}
