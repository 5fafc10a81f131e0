//! adapter-file's parser (`adapter_file::parse`, what the scanner calls on each file it reads)
//! on any text, in either format, then the core's translation of what it defines.
//!
//! Input: one selector byte, then the file's text (UTF-8; the reader rejects anything else
//! before parsing). Selector bit 0: JSON instead of YAML. Bit 1 (YAML): also parse the two
//! halves around the first `---` line on their own; the file is atomic (one bad document
//! rejects it, its other documents are never served half), and good halves add up.
//!
//! Invariants: no panic; an error names the file; every service's origin names the file;
//! every translated service passes `check_served`.

#![no_main]

use adapter_file::{parse, Format};
use libfuzzer_sys::fuzz_target;
use mcp_bridge_fuzz::io::{serve, translate_config};

const FILE: &str = "conf.d/services.yaml";

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = if selector & 1 == 1 {
        Format::Json
    } else {
        Format::Yaml
    };
    let whole = checked(text, format);
    if format == Format::Yaml && selector & 2 == 2 {
        halves(text, whole);
    }
});

/// Parses `text` and checks what came out; the number of services, or `None` on an error.
fn checked(text: &str, format: Format) -> Option<usize> {
    let cfg = translate_config("file");
    match parse(FILE, text, format) {
        Ok(services) => {
            let n = services.len();
            for s in services {
                assert!(
                    s.origin.contains(FILE),
                    "origin {:?} does not name the file",
                    s.origin
                );
                serve(s, &cfg);
            }
            Some(n)
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("file {FILE}")),
                "error does not name the file: {msg}"
            );
            None
        }
    }
}

/// The two halves of a YAML text around its first `---` line, parsed on their own.
fn halves(text: &str, whole: Option<usize>) {
    // Directives (`%YAML`) belong to the document after them and `...` ends one: a half cut
    // next to them is not a file of its own.
    if text.contains('%') || text.contains("\n...") || text.starts_with("...") {
        return;
    }
    let Some(at) = text.find("\n---\n") else {
        return;
    };
    let (a, b) = (&text[..at + 1], &text[at + 5..]);
    match (checked(a, Format::Yaml), checked(b, Format::Yaml)) {
        (Some(x), Some(y)) => assert_eq!(
            whole,
            Some(x + y),
            "two good halves do not add up: {a:?} / {b:?}"
        ),
        _ => assert_eq!(whole, None, "a file with a bad document was served"),
    }
}
