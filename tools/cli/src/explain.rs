//! The job spec's reference, from one source: the spec file's serde
//! structs (`spec.rs`), whose names and defaults serde and schemars share
//! and whose doc comments are the descriptions. `peloton explain
//! FIELD.PATH` prints one field; [`reference`] renders all of them as the
//! page `docs/job-spec.md`, which a test keeps equal to what it renders.

use serde_json::Value;

use crate::spec::JobFile;

/// A field of the spec, as the reference shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Its path from the top (`task.resources.cpu`; a list's items add
    /// `[]`).
    pub path: String,
    /// Its type in YAML words: string, integer, number, boolean, list of
    /// X, map of string, one of the values, or a mapping (its fields).
    pub kind: String,
    /// Its default, if it has one worth saying.
    pub default: Option<String>,
    /// Whether a spec must give it.
    pub required: bool,
    /// What it means.
    pub description: String,
    /// For a choice: each value and what it means.
    pub values: Vec<(String, String)>,
    /// For a mapping: its fields' names, in order.
    pub fields: Vec<String>,
}

/// The spec file's JSON Schema.
fn schema() -> Value {
    schemars::schema_for!(JobFile).to_value()
}

/// `node` with its `$ref` (and a nullable `anyOf`'s) followed into
/// `$defs`, its own description kept over the target's.
fn resolve<'a>(root: &'a Value, node: &'a Value) -> (&'a Value, Option<&'a str>) {
    let own = node.get("description").and_then(Value::as_str);
    let mut at = node;
    loop {
        if let Some(r) = at.get("$ref").and_then(Value::as_str) {
            let name = r.trim_start_matches("#/$defs/");
            at = &root["$defs"][name];
            continue;
        }
        if let Some(any) = at.get("anyOf").and_then(Value::as_array)
            && let Some(inner) = any
                .iter()
                .find(|v| v.get("type") != Some(&Value::from("null")))
        {
            at = inner;
            continue;
        }
        return (
            at,
            own.or_else(|| at.get("description").and_then(Value::as_str)),
        );
    }
}

/// The values of a choice (an enum of strings), with their descriptions.
fn values(node: &Value) -> Vec<(String, String)> {
    if let Some(options) = node.get("oneOf").and_then(Value::as_array) {
        return options
            .iter()
            .filter_map(|o| {
                let value = o
                    .get("const")
                    .or_else(|| o.get("enum").and_then(|e| e.get(0)))?
                    .as_str()?;
                let what = o.get("description").and_then(Value::as_str).unwrap_or("");
                Some((
                    value.to_owned(),
                    one_line(what).trim_end_matches('.').to_owned(),
                ))
            })
            .collect();
    }
    node.get("enum")
        .and_then(Value::as_array)
        .map(|e| {
            e.iter()
                .filter_map(|v| Some((v.as_str()?.to_owned(), String::new())))
                .collect()
        })
        .unwrap_or_default()
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The type of `node` (resolved) in YAML words.
fn kind(root: &Value, node: &Value) -> String {
    if !values(node).is_empty() {
        return "one of the values below".into();
    }
    let ty = match node.get("type") {
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("any")
            .to_owned(),
        Some(Value::String(t)) => t.clone(),
        _ => "any".into(),
    };
    match ty.as_str() {
        "array" => {
            let (items, _) = resolve(root, &node["items"]);
            format!("list of {}", kind(root, items))
        }
        "object" if node.get("properties").is_some() => "mapping (fields below)".into(),
        "object" => {
            let (v, _) = resolve(root, &node["additionalProperties"]);
            format!("map of {}", kind(root, v))
        }
        other => other.into(),
    }
}

/// The field whose schema is `raw` (as its parent lists it), named `path`.
fn field(root: &Value, path: &str, raw: &Value, required: bool) -> Field {
    let (resolved, description) = resolve(root, raw);
    let fields = resolved
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let default = raw
        .get("default")
        .filter(|d| !d.is_null())
        .map(|d| match d {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    Field {
        path: path.to_owned(),
        kind: kind(root, resolved),
        default,
        required,
        description: one_line(description.unwrap_or("")),
        values: values(resolved),
        fields,
    }
}

/// The field at `path` (dot-separated, e.g. `task.resources.cpu`; empty:
/// the whole spec). An unknown name is an error naming it and the fields
/// there are.
pub fn explain(path: &str) -> Result<Field, String> {
    let root = schema();
    let mut raw = &root;
    let mut required = true;
    let mut walked = String::new();
    for name in path.split('.').filter(|s| !s.is_empty()) {
        let name = name.trim_end_matches("[]");
        let (mut here, _) = resolve(&root, raw);
        // Into a list's items.
        while here.get("type") == Some(&Value::from("array")) {
            here = resolve(&root, &here["items"]).0;
        }
        let Some(props) = here.get("properties").and_then(Value::as_object) else {
            return Err(format!(
                "{walked}: has no fields (it is a {})",
                kind(&root, here)
            ));
        };
        let Some(next) = props.get(name) else {
            let there = if walked.is_empty() {
                "a job spec"
            } else {
                &walked
            };
            return Err(format!(
                "{name}: no such field in {there}; its fields are {}",
                props.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        };
        required = here
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|v| v == name));
        raw = next;
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(name);
    }
    let mut f = field(&root, &walked, raw, required);
    if walked.is_empty() {
        f.path = "(a job spec)".into();
    }
    Ok(f)
}

/// `peloton explain`'s text for `f`.
pub fn render(f: &Field) -> String {
    let mut out = format!("FIELD:    {}\nTYPE:     {}\n", f.path, f.kind);
    if f.required {
        out.push_str("REQUIRED: yes\n");
    }
    if let Some(d) = &f.default {
        out.push_str(&format!("DEFAULT:  {d}\n"));
    }
    out.push('\n');
    for line in wrap(&f.description, 76) {
        out.push_str(&format!("  {line}\n"));
    }
    if !f.values.is_empty() {
        out.push_str("\nVALUES:\n");
        for (v, what) in &f.values {
            out.push_str(&format!("  {v:<14} {what}\n"));
        }
    }
    if !f.fields.is_empty() {
        out.push_str("\nFIELDS:\n");
        let prefix = if f.path.starts_with('(') {
            String::new()
        } else {
            format!("{}.", f.path)
        };
        for name in &f.fields {
            let sub = explain(&format!("{prefix}{name}")).expect("a field's own fields exist");
            let first = sub
                .description
                .split(". ")
                .next()
                .unwrap_or("")
                .trim_end_matches('.');
            out.push_str(&format!(
                "  {name:<24} {:<24} {first}\n",
                short_kind(&sub.kind)
            ));
        }
    }
    out
}

fn short_kind(kind: &str) -> String {
    kind.replace(" (fields below)", "")
        .replace("one of the values below", "choice")
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.len() + 1 + word.len() > width {
            lines.push(word.to_owned());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}

/// Every field's path, depth first, in the order the schema lists them.
fn all_paths() -> Vec<String> {
    fn walk(prefix: &str, out: &mut Vec<String>) {
        let f = explain(prefix).expect("the path was listed");
        for name in &f.fields {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            out.push(path.clone());
            walk(&path, out);
        }
    }
    let mut out = Vec::new();
    walk("", &mut out);
    out
}

/// The whole reference as Markdown (`docs/job-spec.md`).
pub fn reference() -> String {
    let mut out = String::from(
        "# Job spec reference\n\n\
         Every field of a job spec file (`peloton job create FILE`), generated from the CLI's\n\
         spec structs (`tools/cli/src/spec.rs`: their serde names, defaults and doc comments), as\n\
         `peloton explain FIELD.PATH` prints one. A test keeps this page equal to what they\n\
         render; to change it, change the doc comments and run\n\
         `UPDATE_EXPECT=1 cargo test -p peloton-cli --lib explain`.\n\n\
         The CLI uses these names everywhere: a job's spec in `-o json` and `-o yaml` is this\n\
         file (fields at their defaults left out), and a server's refusal of a spec names the\n\
         field by its path here (`task.resources.cpu`). The API (gRPC, JSON over HTTP) names\n\
         three differently: `task` is `default_task`, `instances` is `instance_count`,\n\
         `sla.gang_size` is `sla.min_running_instances` (and an override's `task` its `spec`).\n\n\
         | field | type | default | description |\n|---|---|---|---|\n",
    );
    for path in all_paths() {
        let f = explain(&path).expect("listed");
        let mut description = f.description.clone();
        if f.required {
            description = format!("**Required.** {description}");
        }
        if !f.values.is_empty() {
            let vals: Vec<String> = f
                .values
                .iter()
                .map(|(v, what)| {
                    if what.is_empty() {
                        format!("`{v}`")
                    } else {
                        format!("`{v}`: {what}")
                    }
                })
                .collect();
            description.push_str(&format!(" Values: {}.", vals.join("; ")));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.path,
            short_kind(&f.kind),
            f.default
                .as_deref()
                .map_or(String::new(), |d| format!("`{d}`")),
            description.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_names_type_default_and_meaning() {
        let cpu = explain("task.resources.cpu").unwrap();
        assert_eq!(cpu.kind, "number");
        assert!(cpu.description.starts_with("Cores"), "{cpu:?}");
        let t = explain("type").unwrap();
        assert_eq!(t.default.as_deref(), Some("batch"));
        assert!(t.values.iter().any(|(v, _)| v == "daemon"), "{t:?}");
        let name = explain("name").unwrap();
        assert!(!name.required, "a name is optional: {name:?}");
        assert!(explain("task").unwrap().required);
        let task = explain("task").unwrap();
        assert!(task.fields.contains(&"resources".to_owned()), "{task:?}");
        // Into a list's items.
        let over = explain("overrides.task.command").unwrap();
        assert_eq!(over.kind, "string");
        let text = render(&explain("sla").unwrap());
        assert!(text.contains("gang_size"), "{text}");
    }

    #[test]
    fn an_unknown_field_is_named_with_the_fields_there_are() {
        let e = explain("task.resource.cpu").unwrap_err();
        assert!(e.starts_with("resource: no such field in task;"), "{e}");
        assert!(e.contains("resources"), "{e}");
        let e = explain("name.first").unwrap_err();
        assert!(e.contains("has no fields"), "{e}");
    }

    /// Every field, at every depth, says what it is.
    #[test]
    fn every_field_is_described() {
        let undescribed: Vec<String> = all_paths()
            .into_iter()
            .filter(|p| explain(p).unwrap().description.is_empty())
            .collect();
        assert!(
            undescribed.is_empty(),
            "fields without a doc comment: {undescribed:?}"
        );
    }

    /// `docs/job-spec.md` is what the structs render.
    #[test]
    fn the_reference_page_is_up_to_date() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/job-spec.md");
        let rendered = reference();
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(&path, &rendered).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == rendered,
            "docs/job-spec.md differs from what the spec structs render: \
             UPDATE_EXPECT=1 cargo test -p peloton-cli --lib explain"
        );
    }
}
