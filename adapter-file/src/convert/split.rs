//! A large YAML document read one element of its top-level sequence at a time.
//!
//! The YAML parser holds every event of a document until the document ends (measured: 3.4 GiB
//! for a 121 MiB inventory), so [`super::stream`] alone cannot keep one large YAML document
//! small. But in block style a top-level key's sequence is a run of lines, and each `-` at the
//! sequence's indentation starts an element whose lines parse on their own. So, for a file of
//! one document whose `services:` or `items:` is such a block sequence, each element's lines are
//! parsed and converted in turn, and the rest of the document, with `[]` in the sequence's
//! place, is parsed as the document.
//!
//! Anything unusual (more documents, an alias to an anchor outside its element, a quoted string
//! cut in two, a syntax error) makes some piece fail to parse; then [`read`] gives up and the
//! whole document is parsed as before, which also words and places the error as before. The
//! alias-expansion bound applies to the pieces, with one budget for the file: the pieces count
//! at least what the whole document counts, so this is never more lenient.

use std::cell::Cell;

use serde::de::DeserializeSeed;
use yaml_serde::Value;

use super::expansion;
use super::stream::{convert_element, Converted, Document, DocumentSeed, Element, Yaml};
use super::DocRef;

/// Where a document's top-level block sequence is in its text.
struct Layout<'t> {
    /// `services` or `items`.
    key: &'t str,
    /// Byte offset of the key's line.
    key_line: usize,
    /// Byte offset of each element's first line.
    starts: Vec<usize>,
    /// Byte offset just after the sequence's last line.
    end: usize,
}

/// Reads a one-document YAML file element by element; `None` when its layout is not the simple
/// one or any piece does not parse (the caller then parses it whole).
pub(super) fn read(doc: DocRef<'_>, text: &str) -> Option<Document> {
    let layout = layout(text)?;
    let element = match layout.key {
        "items" => Element::Item,
        _ => Element::Service,
    };
    let budget = expansion::budget(text);
    let left = Cell::new(budget);
    let expands = expansion::may_expand(text);
    let within_budget = |piece: &str| {
        !expands
            || expansion::Counter::new(&left, budget)
                .deserialize(yaml_serde::Deserializer::from_str(piece))
                .is_ok()
    };

    let mut converted = Converted::default();
    let ends = layout.starts.iter().skip(1).copied().chain([layout.end]);
    for (index, (start, end)) in layout.starts.iter().copied().zip(ends).enumerate() {
        let piece = &text[start..end];
        if !within_budget(piece) {
            return None;
        }
        let value = match yaml_serde::from_str::<Value>(piece).ok()? {
            Value::Sequence(mut one) if one.len() == 1 => one.pop()?,
            _ => return None,
        };
        if converted.error.is_none() {
            converted.error = convert_element(doc, element, index, value, &mut converted.services);
        }
    }

    let rest = format!(
        "{}{}: []\n{}",
        &text[..layout.key_line],
        layout.key,
        &text[layout.end..]
    );
    if !within_budget(&rest) {
        return None;
    }
    let mut document = DocumentSeed::<Yaml>::new(doc)
        .deserialize(yaml_serde::Deserializer::from_str(&rest))
        .ok()?;
    match element {
        Element::Item => document.items = Some(converted),
        Element::Service => document.services = Some(converted),
    }
    Some(document)
}

/// Finds the one `services:` or `items:` key at the start of a line (the document's top level)
/// followed by a block sequence, in a text of one document. `None` otherwise.
fn layout(text: &str) -> Option<Layout<'_>> {
    let mut found: Option<Layout<'_>> = None;
    // The sequence's indentation once its first element is seen.
    let mut indent = None;
    let mut seen_content = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let body = line.trim_end();
        let content = body.trim_start_matches(' ');
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let column = body.len() - content.len();
        if column == 0 && is_document_marker(content) {
            // A leading `---` is fine; any other marker means more than one document.
            if seen_content {
                return None;
            }
            continue;
        }
        seen_content = true;
        match (&mut found, indent) {
            (None, _) => {
                if let Some(key) = sequence_key(body) {
                    found = Some(Layout {
                        key,
                        key_line: start,
                        starts: Vec::new(),
                        end: text.len(),
                    });
                }
            }
            (Some(layout), None) => {
                // The first line after the key must start the sequence.
                if !is_entry(content) {
                    return None;
                }
                indent = Some(column);
                layout.starts.push(start);
            }
            (Some(layout), Some(indent)) if layout.end == text.len() => {
                if column == indent && is_entry(content) {
                    layout.starts.push(start);
                } else if column <= indent {
                    layout.end = start;
                }
            }
            (Some(_), Some(_)) => {
                if column == 0 && sequence_key(body).is_some() {
                    // A second key of the kind: leave the error to the whole parse.
                    return None;
                }
            }
        }
    }
    found.filter(|l| !l.starts.is_empty())
}

/// `services:` or `items:` with nothing after it but a comment.
fn sequence_key(line: &str) -> Option<&'static str> {
    ["services", "items"].into_iter().find(|key| {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(':'))
            .is_some_and(|rest| {
                let rest = rest.trim_start();
                rest.is_empty() || rest.starts_with('#')
            })
    })
}

/// A block sequence entry: `-` then whitespace or the end of the line.
fn is_entry(content: &str) -> bool {
    content
        .strip_prefix('-')
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// `---` or `...` (the start or end of a document).
fn is_document_marker(content: &str) -> bool {
    ["---", "..."].iter().any(|m| {
        content
            .strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::{parse, Format};

    fn doc() -> DocRef<'static> {
        DocRef {
            file: "s.yaml",
            document: 1,
            item: None,
        }
    }

    /// Element by element: the usual layouts, an element at the key's own indentation, comments
    /// and a leading `---`.
    #[test]
    fn block_sequences_are_read_element_by_element() {
        let texts = [
            "kind: Inventory\nnamespace: shop\nservices:\n  - name: a\n    ports: {http: 80}\n  - name: b\n",
            "---\n# export\nkind: Inventory\nservices:  # all of them\n- name: a\n  ports: {http: 80}\n\n# b next\n- name: b\nnamespace: shop\n",
        ];
        for text in texts {
            let document = read(doc(), text).expect("read element by element");
            let services = document.services.expect("services converted");
            assert!(services.error.is_none());
            let names: Vec<_> = services
                .services
                .iter()
                .map(|s| s.key.name.as_str())
                .collect();
            assert_eq!(names, ["a", "b"], "{text}");
            let whole = parse("s.yaml", text, Format::Yaml).expect("parses");
            assert_eq!(whole.len(), 2);
            assert_eq!(
                whole[1].origin,
                "file s.yaml, document 1 (Inventory shop/b)"
            );
        }
    }

    /// Layouts it leaves to the whole parse, which still reads them as before.
    #[test]
    fn other_layouts_are_parsed_whole() {
        let cases = [
            // Flow style.
            "kind: Inventory\nservices: [{name: a}, {name: b}]\n",
            // More than one document.
            "kind: Inventory\nservices:\n  - name: a\n---\nkind: Inventory\nservices:\n  - name: b\n",
            // An alias to an anchor in another element.
            "kind: Inventory\nservices:\n  - name: a\n    ports: &p {http: 80}\n  - name: b\n    ports: *p\n",
            // A quoted string whose second line looks like an element.
            "kind: Inventory\nservices:\n  - name: a\n    annotations: {note: \"x\n  - y\"}\n  - name: b\n",
        ];
        for text in cases {
            assert!(read(doc(), text).is_none(), "{text}");
            let services = parse("s.yaml", text, Format::Yaml).expect("parses");
            assert_eq!(services.len(), 2, "{text}");
        }
    }

    /// A syntax error in one element is reported as the whole parse reports it, with the line
    /// in the file.
    #[test]
    fn syntax_errors_keep_their_place() {
        let text = "kind: Inventory\nservices:\n  - name: a\n  - name: [b\n  - name: c\n";
        assert!(read(doc(), text).is_none());
        let e = parse("s.yaml", text, Format::Yaml).expect_err("syntax error");
        assert!(
            e.to_string()
                .starts_with("file s.yaml, document 1: YAML syntax error"),
            "{e}"
        );
        assert!(e.to_string().contains("line 5"), "{e}");
    }

    /// The alias bound holds when the file is read in pieces: a wide alias bomb inside one
    /// element is refused, by the whole parse's wording.
    #[test]
    fn alias_bombs_inside_an_element_are_refused() {
        let items = vec!["x"; 1000].join(",");
        let refs = vec!["*a"; 5000].join(",");
        let text = format!(
            "kind: Inventory\nservices:\n  - name: a\n    labels: {{a: &a [{items}], b: [{refs}]}}\n"
        );
        assert!(read(doc(), &text).is_none());
        let e = parse("s.yaml", &text, Format::Yaml).expect_err("refused");
        assert!(e.to_string().contains("aliases expand"), "{e}");
    }
}
