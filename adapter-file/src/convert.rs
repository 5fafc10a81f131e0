//! Parsing: the text of one file -> the [`Service`]s it defines, or one error naming the file,
//! the document, the resource and the field. This is the entry point; the formats and their
//! conversions live in the submodules:
//!
//! - [`de`]: typed deserialization that names the failing field;
//! - [`location`]: where a document is, for origins and errors; [`error`]: the error type;
//! - [`istio`] (Istio's ServiceEntry as written in YAML/JSON) and [`service_entry`] (its
//!   conversion); [`inventory_format`] (the compact inventory) and [`inventory`] (its
//!   conversion);
//! - [`address`], [`protocol`], [`time`]: the small parsers those conversions need;
//! - [`expansion`]: the bound on what YAML aliases may expand a file to;
//! - [`stream`] and [`split`]: a document's `services` or `items` read one element at a time.
//!
//! Only shape is checked here (required fields, types, enum values, unknown fields). Semantic
//! validation (DNS host names, label syntax, port name rules, STATIC endpoints being IPs) is the
//! core's job, which is why every [`Service`] carries an `origin` naming the file and document.
//!
//! Every resource (a document, an item of a `List`, a service of an `Inventory`) is first parsed
//! into a [`yaml_serde::Value`] (JSON is converted into one), then deserialized into typed
//! structs through `serde_path_to_error`, so that a type error says `spec.ports[0].number`
//! rather than just "invalid type". A document's `items` and `services` are read one element
//! at a time ([`stream`]), so the whole file never becomes one value tree.

mod address;
mod de;
mod error;
mod expansion;
mod inventory;
mod inventory_format;
mod istio;
mod location;
mod protocol;
mod service_entry;
mod split;
mod stream;
#[cfg(test)]
mod test_support;
mod time;

use std::path::Path;

use mcp_core::model::Service;
use serde::de::DeserializeSeed;
use yaml_serde::Value;

pub use error::ConvertError;
pub use inventory_format::INVENTORY_API_VERSION;
pub use istio::ISTIO_API_VERSIONS;
pub use protocol::protocol_from_name;
pub use time::parse_rfc3339;

use inventory::{inventory, inventory_streamed};
use location::DocRef;
use service_entry::service_entry;
use stream::DocumentSeed;

/// How a file's text is parsed; chosen by extension so a `.json` file gets JSON error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One or more YAML documents separated by `---`.
    Yaml,
    /// One JSON value (an object or a `kind: List`).
    Json,
}

impl Format {
    /// `.json` (any case) is JSON; everything else, including files named explicitly without a
    /// known extension, is YAML (which also reads most JSON).
    pub fn for_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Yaml,
        }
    }
}

/// Parses one file. `file` is how the file is named in origins and errors (the path as
/// configured, so operators recognise it).
///
/// Each document is streamed ([`stream`]): the elements of a top-level `services` or `items`
/// are converted as they are read, so a large file is never held as one value tree. Errors
/// are what they were when the whole file was parsed first: a syntax error anywhere in the
/// file wins over a conversion error, and the first conversion error wins over later ones.
pub fn parse(file: &str, text: &str, format: Format) -> Result<Vec<Service>, ConvertError> {
    let mut services = Vec::new();
    let mut first_error = None;
    let mut on_document = |doc: DocRef<'_>, document: stream::Document| {
        if first_error.is_none() {
            if let Err(e) = finish(doc, document, &mut services) {
                first_error = Some(e);
            }
        }
    };
    match format {
        Format::Json => parse_json(file, text, &mut on_document)?,
        Format::Yaml => parse_yaml(file, text, &mut on_document)?,
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(services),
    }
}

fn parse_json(
    file: &str,
    text: &str,
    on_document: &mut dyn FnMut(DocRef<'_>, stream::Document),
) -> Result<(), ConvertError> {
    let syntax = |e: serde_json::Error| ConvertError::Syntax {
        at: format!("file {file}"),
        format: "JSON",
        message: e.to_string(),
    };
    let doc = DocRef {
        file,
        document: 1,
        item: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let document = DocumentSeed::<stream::Json>::new(doc)
        .deserialize(&mut de)
        .map_err(syntax)?;
    de.end().map_err(syntax)?;
    on_document(doc, document);
    Ok(())
}

fn parse_yaml(
    file: &str,
    text: &str,
    on_document: &mut dyn FnMut(DocRef<'_>, stream::Document),
) -> Result<(), ConvertError> {
    let syntax = |index: usize, e: yaml_serde::Error| ConvertError::Syntax {
        at: format!("file {file}, document {}", index + 1),
        format: "YAML",
        message: e.to_string(),
    };
    // One large document, element by element, when its layout allows.
    let first = DocRef {
        file,
        document: 1,
        item: None,
    };
    if let Some(document) = split::read(first, text) {
        on_document(first, document);
        return Ok(());
    }
    if expansion::may_expand(text) {
        let budget = expansion::budget(text);
        let left = std::cell::Cell::new(budget);
        for (index, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
            expansion::Counter::new(&left, budget)
                .deserialize(document)
                .map_err(|e| syntax(index, e))?;
        }
    }
    for (index, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let doc = DocRef {
            file,
            document: index + 1,
            item: None,
        };
        let document = DocumentSeed::<stream::Yaml>::new(doc)
            .deserialize(document)
            .map_err(|e| syntax(index, e))?;
        on_document(doc, document);
    }
    Ok(())
}

/// Converts a streamed document: its own fields are checked as a whole document's were, then
/// what its `items` or `services` converted to is taken (or their first error reported).
fn finish(
    doc: DocRef<'_>,
    document: stream::Document,
    out: &mut Vec<Service>,
) -> Result<(), ConvertError> {
    let stream::Document {
        value,
        items,
        services,
    } = document;
    // Empty documents (a trailing `---`, a file of comments) define nothing.
    if value.is_null() {
        return Ok(());
    }
    match (value.get("kind").and_then(Value::as_str), items, services) {
        (Some("List"), Some(items), _) => {
            if let Some((e, _)) = items.error {
                return Err(e);
            }
            out.extend(items.services);
            Ok(())
        }
        (Some("Inventory"), _, Some(services)) => {
            out.extend(inventory_streamed(doc, value, services)?);
            Ok(())
        }
        _ => convert_document(doc, value, out),
    }
}

fn convert_document(
    doc: DocRef<'_>,
    value: Value,
    out: &mut Vec<Service>,
) -> Result<(), ConvertError> {
    if !value.is_mapping() {
        return Err(doc.invalid(
            doc.to_string(),
            "",
            "expected a mapping with `kind` (ServiceEntry, Inventory or List)",
        ));
    }
    let kind = match value.get("kind") {
        None | Some(Value::Null) => {
            return Err(doc.invalid(doc.to_string(), "kind", "missing field `kind`"))
        }
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => return Err(doc.invalid(doc.to_string(), "kind", "expected a string")),
    };
    match kind.as_str() {
        "ServiceEntry" => out.push(service_entry(doc, value)?),
        "Inventory" => out.extend(inventory(doc, value)?),
        "List" if doc.item.is_none() => list(doc, value, out)?,
        "List" => {
            return Err(doc.invalid(doc.to_string(), "kind", "a List cannot contain a List"));
        }
        other => {
            return Err(doc.invalid(
                doc.to_string(),
                "kind",
                format!("unsupported kind `{other}` (expected ServiceEntry, Inventory or List)"),
            ));
        }
    }
    Ok(())
}

/// `kind: List` (what `kubectl get -o yaml|json` writes): each item is converted as if it were
/// its own document; its `apiVersion` is not checked because Kubernetes writes `v1`.
fn list(doc: DocRef<'_>, value: Value, out: &mut Vec<Service>) -> Result<(), ConvertError> {
    let items = match value {
        Value::Mapping(mut fields) => fields.shift_remove("items"),
        _ => None,
    };
    let items = match items {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Sequence(items)) => items,
        Some(_) => return Err(doc.invalid(doc.to_string(), "items", "expected a sequence")),
    };
    for (i, item) in items.into_iter().enumerate() {
        let item_doc = DocRef {
            item: Some(i),
            ..doc
        };
        convert_document(item_doc, item, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::test_support::err;
    use mcp_core::model::{Host, Location, Resolution, ServiceKey};

    #[test]
    fn json_list() {
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "networking.istio.io/v1beta1", "kind": "ServiceEntry",
             "metadata": {"name": "a"}, "spec": {"hosts": ["a.example.com"]}},
            {"apiVersion": "networking.istio.io/v1alpha3", "kind": "ServiceEntry",
             "metadata": {"name": "b", "namespace": "x"},
             "spec": {"hosts": ["b.example.com"], "resolution": "DNS"}}
        ]}"#;
        let services = parse("l.json", json, Format::Json).expect("parses");
        let keys: Vec<_> = services.iter().map(|s| s.key.clone()).collect();
        assert_eq!(
            keys,
            vec![ServiceKey::new("a"), ServiceKey::namespaced("x", "b")]
        );
        assert_eq!(
            services[1].origin,
            "file l.json, document 1, items[1] (ServiceEntry x/b)"
        );
        assert_eq!(services[1].resolution, Resolution::Dns);
        // Istio's default resolution is NONE.
        assert_eq!(services[0].resolution, Resolution::None);
    }

    #[test]
    fn yaml_list_error_paths_start_at_the_item() {
        let yaml = r#"
kind: List
items:
  - apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: a}
    spec: {hosts: [a.example.com], ports: [{number: x, name: http}]}
"#;
        let e = err("l.yaml", yaml, Format::Yaml);
        assert!(e.contains("document 1, items[0] (ServiceEntry a)"), "{e}");
        assert!(e.contains("items[0].spec.ports[0].number"), "{e}");
    }

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let yaml = r#"
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: one}
spec: {hosts: [one.example.com]}
---
# only a comment
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: two}
spec: {hosts: [two.example.com]}
---
"#;
        let services = parse("m.yaml", yaml, Format::Yaml).expect("parses");
        let origins: Vec<_> = services.iter().map(|s| s.origin.as_str()).collect();
        assert_eq!(
            origins,
            vec![
                "file m.yaml, document 1 (ServiceEntry one)",
                "file m.yaml, document 3 (ServiceEntry two)"
            ]
        );
    }

    #[test]
    fn unknown_kind_and_api_version_are_errors() {
        let e = err(
            "k.yaml",
            "kind: Deployment\napiVersion: apps/v1\n",
            Format::Yaml,
        );
        assert!(e.contains("unsupported kind `Deployment`"), "{e}");
        assert!(e.contains("document 1"), "{e}");

        let yaml = "apiVersion: networking.istio.io/v2\nkind: ServiceEntry\nmetadata: {name: a}\nspec: {hosts: [a.example.com]}\n";
        let e = err("k.yaml", yaml, Format::Yaml);
        assert!(e.contains("apiVersion: unsupported apiVersion"), "{e}");
        assert!(e.contains("(ServiceEntry a)"), "{e}");

        let e = err(
            "k.yaml",
            "apiVersion: mcp-adapter/v2\nkind: Inventory\n",
            Format::Yaml,
        );
        assert!(e.contains("unsupported apiVersion `mcp-adapter/v2`"), "{e}");
    }

    #[test]
    fn syntax_errors_name_the_document() {
        let yaml = "kind: Inventory\n---\nkind: [unclosed\n";
        let e = err("s.yaml", yaml, Format::Yaml);
        assert!(
            e.contains("file s.yaml, document 2: YAML syntax error"),
            "{e}"
        );
        let e = err("s.json", "{\"kind\": ", Format::Json);
        assert!(e.contains("file s.json: JSON syntax error"), "{e}");
    }

    /// The classic billion laughs: ten levels of ten aliases each. Refused by the parser's
    /// repetition limit, named by file and document.
    #[test]
    fn an_alias_bomb_is_refused() {
        let mut yaml = String::from(
            "kind: Inventory\n---\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
        );
        for i in 1..10 {
            let refs = vec![format!("*l{}", i - 1); 10].join(", ");
            yaml.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
        }
        let e = err("bomb.yaml", &yaml, Format::Yaml);
        assert!(
            e.contains("file bomb.yaml, document 2: YAML syntax error"),
            "{e}"
        );
        assert!(e.contains("repetition limit exceeded"), "{e}");
    }

    /// A wide alias bomb: one anchored sequence of 1,000 scalars, aliased 5,000 times, is a 20 KB
    /// file that expands to five million values (a 16 MiB file would expand to billions and
    /// exhaust memory). The parser's repetition limit counts alias jumps, not what they copy;
    /// the file's expansion is bounded by its size.
    #[test]
    fn a_wide_alias_bomb_is_refused_before_it_expands() {
        let items = vec!["x"; 1000].join(",");
        let refs = vec!["*a"; 5000].join(",");
        let yaml = format!("a: &a [{items}]\nb: [{refs}]\n");
        let e = err("wide.yaml", &yaml, Format::Yaml);
        assert!(
            e.contains("file wide.yaml, document 1: YAML syntax error"),
            "{e}"
        );
        assert!(e.contains("aliases expand"), "{e}");
        // Refused at the count of one million values, not after five million: what bounds the
        // work (a wall-clock bound here failed under load, where 1.3 s alone took over 5 s).
        assert!(e.contains("1000000 values"), "{e}");

        // Aliases used as intended (a shared port list) are fine.
        let shared = r#"
kind: List
items:
  - apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: a}
    spec: {hosts: ["*.a.example.com"], ports: &ports [{number: 80, name: http}]}
  - apiVersion: networking.istio.io/v1
    kind: ServiceEntry
    metadata: {name: b}
    spec: {hosts: [b.example.com], ports: *ports}
"#;
        let services = parse("shared.yaml", shared, Format::Yaml).expect("parses");
        assert_eq!(services.len(), 2);
        assert_eq!(services[1].ports[0].number, 80);
    }

    /// Nesting deeper than the parser's recursion limit is an error, not a stack overflow.
    #[test]
    fn deep_nesting_is_refused() {
        let yaml = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let e = err("deep.yaml", &yaml, Format::Yaml);
        assert!(e.contains("file deep.yaml, document 1"), "{e}");
        assert!(e.contains("recursion limit exceeded"), "{e}");
    }

    /// The repository's examples must keep parsing (their Istio validity was checked against
    /// the core's translation when they were written).
    #[test]
    fn repository_examples_parse() {
        let read = |name: &str| {
            let path = format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).expect("example exists");
            parse(name, &text, Format::Yaml).expect("example parses")
        };
        let shop = read("shop.yaml");
        let keys: Vec<_> = shop.iter().map(|s| s.key.to_string()).collect();
        assert_eq!(
            keys,
            vec!["shop/payments", "shop/catalog", "shop/stripe-api"]
        );
        assert_eq!(shop[2].location, Location::External);
        assert_eq!(shop[2].resolution, Resolution::Dns);
        let inventory = read("inventory.yaml");
        let keys: Vec<_> = inventory.iter().map(|s| s.key.to_string()).collect();
        assert_eq!(keys, vec!["legacy/billing", "legacy/ledger-db"]);
        assert_eq!(inventory[0].hosts, vec![Host::Relative("billing".into())]);
        assert_eq!(inventory[0].endpoints[1].ports.get("http"), Some(&8081));
    }
}
