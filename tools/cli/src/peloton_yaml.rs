//! Peloton's own YAML files, read into the CLI's native spec structs: the
//! job config (`JobConfig` of uber/peloton's v0 API: `instanceCount`,
//! `defaultConfig`, `instanceConfig`, `sla`, …) and the resource pool config
//! (`ResourcePoolConfig`: `resources: [{kind, reservation, limit, share}]`,
//! `controllerLimit`, `slackLimit`, …). Files written for Peloton run here
//! as they are, and `peloton convert` prints them in the native format.
//!
//! Keys match whatever their case: Peloton's loader lowercases them, so its
//! files spell them both ways (`instanceCount`, `instancecount`). Every field
//! is mapped to its equivalent, or noted (informational fields, kept as
//! labels or ignored: a [`Note`] that the CLI prints), or refused with an
//! error naming its YAML path and saying why — never dropped silently.
//!
//! Meanings kept: Peloton's MB are taken as MiB (1:1), cpu as cores, seconds
//! become milliseconds. Where Peloton reads 0 as a default, that default is
//! written out (health check timings, the kill grace period); where it reads
//! 0 as "none" (a pool's limit, a percentage limit), the smallest amount
//! stands for it, since 0 means "no limit" in our API. An instance config is
//! merged over the default config as Peloton merges it (top-level fields; an
//! instance config's booleans always win) and becomes a whole override.

use std::collections::BTreeMap;
use std::fmt;

use serde_norway::Value;

use crate::spec::{
    HealthCheckFile, JobFile, JobTypeName, OverrideFile, PlacementName, PoolFile, PoolKindName,
    ResourcesFile, SlaFile, TaskFile, VolumeFile,
};

/// The two formats the CLI reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The CLI's own (`examples/*.yaml`).
    Native,
    /// uber/peloton's v0 job and resource pool configs.
    Peloton,
}

/// What a Peloton-format file describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Job,
    Pool,
}

/// A field of a Peloton-format file that cannot be taken: its YAML path as
/// written (`defaultConfig.container`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PelotonError {
    pub path: String,
    pub problem: String,
}

impl fmt::Display for PelotonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.problem)
        } else {
            write!(f, "{}: {}", self.path, self.problem)
        }
    }
}

impl std::error::Error for PelotonError {}

/// A field taken without an effect of its own (kept as a label, or
/// ignored), said out loud so that nothing is dropped silently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub path: String,
    pub text: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.text)
    }
}

type Result<T> = std::result::Result<T, PelotonError>;

fn fail<T>(path: &str, problem: impl Into<String>) -> Result<T> {
    Err(PelotonError {
        path: path.to_owned(),
        problem: problem.into(),
    })
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn note(notes: &mut Vec<Note>, path: &str, text: &str) {
    let note = Note {
        path: path.to_owned(),
        text: text.to_owned(),
    };
    // An instance config inherits the default config's fields: one note each.
    if !notes.contains(&note) {
        notes.push(note);
    }
}

/// Label keys that keep a job's informational fields.
pub const OWNING_TEAM_LABEL: &str = "peloton.owning_team";
pub const LDAP_GROUPS_LABEL: &str = "peloton.ldap_groups";
pub const DESCRIPTION_LABEL: &str = "peloton.description";

// ---------------------------------------------------------------- reading

/// Reads YAML as Peloton's loader (Go's yaml.v2) does: a key given twice in
/// one mapping is taken from its last occurrence (Peloton's own
/// test_stateless_job.yaml gives `changeLog` twice). Returns the value and
/// the paths of the keys given twice (for notes; the native format refuses
/// them).
pub fn load(text: &str) -> std::result::Result<(Value, Vec<String>), serde_norway::Error> {
    use serde::de::DeserializeSeed;
    let twice = std::cell::RefCell::new(Vec::new());
    let seed = Lenient {
        path: String::new(),
        twice: &twice,
    };
    let value = seed.deserialize(serde_norway::Deserializer::from_str(text))?;
    Ok((value, twice.into_inner()))
}

/// A note for each key given twice (see [`load`]).
pub fn twice_notes(paths: &[String]) -> Vec<Note> {
    paths
        .iter()
        .map(|path| Note {
            path: path.clone(),
            text: "given twice: the last one is taken, as Peloton's loader takes it".to_owned(),
        })
        .collect()
}

/// A YAML value at `path`, keys given twice recorded in `twice`.
struct Lenient<'t> {
    path: String,
    twice: &'t std::cell::RefCell<Vec<String>>,
}

impl<'t> Lenient<'t> {
    fn at(&self, path: String) -> Lenient<'t> {
        Lenient {
            path,
            twice: self.twice,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Lenient<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Lenient<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, b: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> std::result::Result<Value, E> {
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E>(self, u: u64) -> std::result::Result<Value, E> {
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E>(self, f: f64) -> std::result::Result<Value, E> {
        Ok(Value::Number(f.into()))
    }

    fn visit_str<E>(self, s: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> std::result::Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> std::result::Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) =
            seq.next_element_seed(self.at(format!("{}[{}]", self.path, items.len())))?
        {
            items.push(item);
        }
        Ok(Value::Sequence(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut mapping = serde_norway::Mapping::new();
        while let Some(key) = map.next_key_seed(self.at(self.path.clone()))? {
            let path = join(&self.path, &key_text(&key));
            let value = map.next_value_seed(self.at(path.clone()))?;
            if mapping.insert(key, value).is_some() {
                self.twice.borrow_mut().push(path);
            }
        }
        Ok(Value::Mapping(mapping))
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(
        self,
        data: A,
    ) -> std::result::Result<Value, A::Error> {
        use serde::de::VariantAccess;
        let (tag, contents) = data.variant::<String>()?;
        let value = contents.newtype_variant_seed(self)?;
        Ok(Value::Tagged(Box::new(serde_norway::value::TaggedValue {
            tag: serde_norway::value::Tag::new(tag),
            value,
        })))
    }
}

fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// A value and its YAML path in the file, spelt as the user wrote it.
#[derive(Clone, Debug)]
struct Node<'a> {
    path: String,
    value: &'a Value,
}

impl<'a> Node<'a> {
    fn root(value: &'a Value) -> Self {
        Node {
            path: String::new(),
            value,
        }
    }

    fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "nothing",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Sequence(_) => "a list",
            Value::Mapping(_) => "a mapping",
            Value::Tagged(_) => "a tagged value",
        }
    }

    fn expected<T>(&self, what: &str) -> Result<T> {
        fail(&self.path, format!("expected {what}, got {}", self.kind()))
    }

    /// A string; numbers and booleans read as their text (label values).
    fn string(&self) -> Result<String> {
        match self.value {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            _ => self.expected("a string"),
        }
    }

    /// A finite, non-negative number.
    fn number(&self) -> Result<f64> {
        let Value::Number(n) = self.value else {
            return self.expected("a number");
        };
        let v = n.as_f64().unwrap_or(f64::NAN);
        if !v.is_finite() {
            return fail(&self.path, "must be a finite number");
        }
        if v < 0.0 {
            return fail(&self.path, format!("must not be negative (got {v})"));
        }
        Ok(v)
    }

    /// A whole number that fits Peloton's `uint32`.
    fn count(&self) -> Result<u32> {
        let Value::Number(n) = self.value else {
            return self.expected("a whole number");
        };
        if let Some(v) = n.as_u64() {
            return u32::try_from(v)
                .or_else(|_| fail(&self.path, format!("{v} is more than {}", u32::MAX)));
        }
        if n.as_i64().is_some_and(|v| v < 0) {
            return fail(&self.path, format!("must not be negative (got {n})"));
        }
        self.expected("a whole number")
    }

    fn boolean(&self) -> Result<bool> {
        match self.value {
            Value::Bool(b) => Ok(*b),
            _ => self.expected("true or false"),
        }
    }

    fn list(&self) -> Result<Vec<Node<'a>>> {
        let Value::Sequence(items) = self.value else {
            return self.expected("a list");
        };
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, value)| Node {
                path: format!("{}[{i}]", self.path),
                value,
            })
            .collect())
    }

    fn fields(&self, what: &'static str) -> Result<Fields<'a>> {
        Fields::of(self, what)
    }

    /// A protobuf enum, by name (any case) or number; `names[i]` is the
    /// name of value `i`.
    fn choice(&self, names: &[&str]) -> Result<usize> {
        let found = match self.value {
            Value::String(s) => names.iter().position(|n| n.eq_ignore_ascii_case(s)),
            Value::Number(n) => n
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .filter(|&v| v < names.len()),
            _ => None,
        };
        found.map_or_else(
            || {
                let accepted: Vec<String> = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("{n} ({i})"))
                    .collect();
                fail(
                    &self.path,
                    format!(
                        "unknown value {}; one of {}",
                        key_text(self.value),
                        accepted.join(", ")
                    ),
                )
            },
            Ok,
        )
    }
}

struct Entry<'a> {
    key: String,
    lower: String,
    value: &'a Value,
    taken: bool,
}

/// A mapping's fields by lower-case key. Each is taken once; any left over
/// is an unknown field.
struct Fields<'a> {
    path: String,
    what: &'static str,
    entries: Vec<Entry<'a>>,
}

impl<'a> Fields<'a> {
    fn of(node: &Node<'a>, what: &'static str) -> Result<Self> {
        let Value::Mapping(map) = node.value else {
            return node.expected(&format!("a mapping ({what})"));
        };
        let mut entries: Vec<Entry<'a>> = Vec::with_capacity(map.len());
        for (key, value) in map {
            let key = key_text(key);
            let lower = key.to_ascii_lowercase();
            if let Some(first) = entries.iter().find(|e| e.lower == lower) {
                return fail(
                    &join(&node.path, &key),
                    format!(
                        "given twice (keys are case-insensitive: `{}` and `{key}`)",
                        first.key
                    ),
                );
            }
            entries.push(Entry {
                key,
                lower,
                value,
                taken: false,
            });
        }
        Ok(Fields {
            path: node.path.clone(),
            what,
            entries,
        })
    }

    /// The field named `key` (lower case), unless it is absent or null
    /// (which Peloton's loader also reads as unset).
    fn take(&mut self, key: &str) -> Option<Node<'a>> {
        let entry = self.entries.iter_mut().find(|e| e.lower == key)?;
        entry.taken = true;
        if entry.value.is_null() {
            return None;
        }
        Some(Node {
            path: join(&self.path, &entry.key),
            value: entry.value,
        })
    }

    /// The path of `key` (spelt as Peloton's proto does), as in the file if
    /// it is there.
    fn path_of(&self, key: &str) -> String {
        let lower = key.to_ascii_lowercase();
        let written = self.entries.iter().find(|e| e.lower == lower);
        join(&self.path, written.map_or(key, |e| e.key.as_str()))
    }

    fn finish(self) -> Result<()> {
        match self.entries.iter().find(|e| !e.taken) {
            Some(e) => fail(
                &join(&self.path, &e.key),
                format!("unknown field of {}", self.what),
            ),
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------- detection

/// Top-level keys only the native job format has.
const NATIVE_JOB_KEYS: [&str; 7] = [
    "task",
    "instances",
    "pool",
    "overrides",
    "placement",
    "stateful",
    "host_pool",
];
/// Top-level keys only Peloton's job config has.
const PELOTON_JOB_KEYS: [&str; 10] = [
    "instancecount",
    "defaultconfig",
    "instanceconfig",
    "owningteam",
    "ldapgroups",
    "changelog",
    "respoolid",
    "placementstrategy",
    "description",
    "defaultspec",
];
/// Top-level keys only the native pool format has.
const NATIVE_POOL_KEYS: [&str; 9] = [
    "path",
    "pools",
    "reservation",
    "limit",
    "share",
    "shares",
    "kind",
    "controller_limit_pct",
    "slack_limit_pct",
];
/// Top-level keys only Peloton's resource pool config has.
const PELOTON_POOL_KEYS: [&str; 10] = [
    "name",
    "resources",
    "owningteam",
    "ldapgroups",
    "description",
    "changelog",
    "policy",
    "controllerlimit",
    "slacklimit",
    "parent",
];

fn top_keys(root: &Value) -> Vec<String> {
    root.as_mapping()
        .map(|m| m.keys().map(key_text).collect())
        .unwrap_or_default()
}

fn first_of<'k>(keys: &'k [String], set: &[&str]) -> Option<&'k String> {
    keys.iter()
        .find(|k| set.contains(&k.to_ascii_lowercase().as_str()))
}

fn format_of(root: &Value, native: &[&str], peloton: &[&str]) -> Result<Format> {
    let keys = top_keys(root);
    match (first_of(&keys, native), first_of(&keys, peloton)) {
        (Some(n), Some(p)) => fail(
            "",
            format!(
                "mixes the native format's `{n}` with Peloton's `{p}`; write one format or the other"
            ),
        ),
        (None, Some(_)) => Ok(Format::Peloton),
        _ => Ok(Format::Native),
    }
}

/// Refuses an Aurora job update request (`taskConfig`, `instanceCount`,
/// `settings`), what Peloton's Aurora bridge takes: its `instanceCount`
/// would otherwise pass it for a Peloton job config with no name.
fn not_aurora_update(root: &Value) -> Result<()> {
    let keys = top_keys(root);
    if first_of(&keys, &["taskconfig"]).is_some()
        && first_of(&keys, &["name", "defaultconfig", "resources"]).is_none()
    {
        return fail(
            "",
            "this is an Aurora job update request (taskConfig, instanceCount, settings), what \
             Peloton's Aurora bridge takes, not a Peloton job config (name, instanceCount, \
             defaultConfig, …): write the job as a job config",
        );
    }
    Ok(())
}

/// Which format a job file is in, from its top-level keys (a file with
/// neither format's own keys is read as native, whose errors then apply).
pub fn job_format(root: &Value) -> Result<Format> {
    not_aurora_update(root)?;
    let format = format_of(root, &NATIVE_JOB_KEYS, &PELOTON_JOB_KEYS)?;
    // Peloton's labels are a list of {key, value}; ours a mapping.
    let listed_labels = root
        .as_mapping()
        .and_then(|m| {
            m.iter()
                .find(|(k, _)| key_text(k).eq_ignore_ascii_case("labels"))
        })
        .is_some_and(|(_, v)| v.is_sequence());
    let native = first_of(&top_keys(root), &NATIVE_JOB_KEYS).is_some();
    Ok(if listed_labels && !native {
        Format::Peloton
    } else {
        format
    })
}

/// Which format a pool file is in, from its top-level keys.
pub fn pool_format(root: &Value) -> Result<Format> {
    format_of(root, &NATIVE_POOL_KEYS, &PELOTON_POOL_KEYS)
}

/// What a Peloton-format file describes (for `peloton convert`); an error
/// if it is in the native format or could be either.
pub fn kind(root: &Value) -> Result<Kind> {
    not_aurora_update(root)?;
    let keys = top_keys(root);
    if let Some(k) = first_of(&keys, &NATIVE_JOB_KEYS).or(first_of(&keys, &NATIVE_POOL_KEYS)) {
        return fail(
            "",
            format!(
                "not in Peloton's format (`{k}` is a key of the native format, which needs no conversion)"
            ),
        );
    }
    const POOL_ONLY: [&str; 5] = [
        "resources",
        "policy",
        "controllerlimit",
        "slacklimit",
        "parent",
    ];
    const JOB_ONLY: [&str; 10] = [
        "instancecount",
        "defaultconfig",
        "instanceconfig",
        "sla",
        "type",
        "labels",
        "respoolid",
        "placementstrategy",
        "owner",
        "defaultspec",
    ];
    match (first_of(&keys, &JOB_ONLY), first_of(&keys, &POOL_ONLY)) {
        (Some(j), Some(p)) => fail(
            "",
            format!("has a job's `{j}` and a resource pool's `{p}`; a file is one or the other"),
        ),
        (Some(_), None) => Ok(Kind::Job),
        (None, Some(_)) => Ok(Kind::Pool),
        (None, None) => fail(
            "",
            "cannot tell a job (instanceCount, defaultConfig, …) from a resource pool (resources, …)",
        ),
    }
}

// ---------------------------------------------------------------- jobs

const JOB_CONFIG: &str = "Peloton's job config (JobConfig)";
const TASK_CONFIG: &str = "Peloton's task config (TaskConfig)";

/// A job's labels with the path each came from, so that a clash names
/// both.
#[derive(Default)]
struct Labels(BTreeMap<String, (String, String)>);

impl Labels {
    fn add(&mut self, key: &str, value: String, path: &str) -> Result<()> {
        if let Some((old, from)) = self.0.get(key) {
            if *old != value {
                return fail(
                    path,
                    format!(
                        "label {key:?} is already {old:?} (from {from}); a job's labels have one value each"
                    ),
                );
            }
            return Ok(());
        }
        self.0.insert(key.to_owned(), (value, path.to_owned()));
        Ok(())
    }
}

/// Peloton's labels: a list of `{key, value}`.
fn label_list(node: &Node<'_>) -> Result<Vec<(String, String, String)>> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    for item in node.list()? {
        let mut f = item.fields("Peloton's Label (key, value)")?;
        let key_path = f.path_of("key");
        let key = f.take("key").map(|n| n.string()).transpose()?;
        let value = f.take("value").map(|n| n.string()).transpose()?;
        f.finish()?;
        let key = key.filter(|k| !k.is_empty());
        let Some(key) = key else {
            return fail(&key_path, "missing");
        };
        if out.iter().any(|(k, _, _)| *k == key) {
            return fail(&key_path, format!("label {key:?} is given twice"));
        }
        out.push((key, value.unwrap_or_default(), item.path.clone()));
    }
    Ok(out)
}

/// A pool named by Peloton's `ResourcePoolID` (`{value: ...}`) or a plain
/// string: here pools are named by their paths, and `root` is `/`.
fn pool_path(node: &Node<'_>) -> Result<(String, String)> {
    let (path, text) = match node.value {
        Value::Mapping(_) => {
            let mut f = node.fields("Peloton's ResourcePoolID (value)")?;
            let path = f.path_of("value");
            let value = f.take("value").map(|n| n.string()).transpose()?;
            f.finish()?;
            (path, value.unwrap_or_default())
        }
        _ => (node.path.clone(), node.string()?),
    };
    if text == "root" || text == "/" {
        return Ok(("/".to_owned(), path));
    }
    if !text.starts_with('/') {
        return fail(
            &path,
            format!(
                "{text:?} is not a pool path: pools are named by their paths here (such as /demo; `root` is /)"
            ),
        );
    }
    Ok((text.trim_end_matches('/').to_owned(), path))
}

/// Reads Peloton's job config into the native structs.
pub fn job(root: &Value) -> Result<(JobFile, Vec<Note>)> {
    not_aurora_update(root)?;
    let mut notes = Vec::new();
    let mut f = Node::root(root).fields(JOB_CONFIG)?;
    if let Some(n) = f.take("defaultspec") {
        return fail(
            &n.path,
            "Peloton's v1alpha job specs are not supported; write the v0 job config (defaultConfig, instanceConfig)",
        );
    }
    if let Some(n) = f.take("changelog") {
        note(
            &mut notes,
            &n.path,
            "ignored: a version record that the server keeps",
        );
    }
    let name_path = f.path_of("name");
    let name = f.take("name").map(|n| n.string()).transpose()?;
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return fail(&name_path, "missing: the job's name");
    };
    let job_type = match f.take("type") {
        None => JobTypeName::Batch,
        Some(n) => match n.choice(&["BATCH", "SERVICE", "DAEMON"])? {
            0 => JobTypeName::Batch,
            1 => JobTypeName::Service,
            _ => JobTypeName::Daemon,
        },
    };
    let mut labels = Labels::default();
    if let Some(n) = f.take("owningteam") {
        labels.add(OWNING_TEAM_LABEL, n.string()?, &n.path)?;
    }
    if let Some(n) = f.take("ldapgroups") {
        let groups = n
            .list()?
            .iter()
            .map(Node::string)
            .collect::<Result<Vec<_>>>()?;
        labels.add(LDAP_GROUPS_LABEL, groups.join(","), &n.path)?;
    }
    if let Some(n) = f.take("description") {
        labels.add(DESCRIPTION_LABEL, n.string()?, &n.path)?;
    }
    if let Some(n) = f.take("labels") {
        for (key, value, path) in label_list(&n)? {
            labels.add(&key, value, &path)?;
        }
    }
    let count_path = f.path_of("instanceCount");
    let instance_count = f.take("instancecount").map(|n| n.count()).transpose()?;
    let sla = f.take("sla");
    let default_path = f.path_of("defaultConfig");
    let default_config = f.take("defaultconfig");
    let instance_config = f.take("instanceconfig");
    let pool = match f.take("respoolid") {
        Some(n) => pool_path(&n)?.0,
        None => String::new(),
    };
    let owner = f.take("owner").map(|n| n.string()).transpose()?;
    let placement = match f.take("placementstrategy") {
        None => PlacementName::Pack,
        Some(n) => match n.choice(&[
            "PLACEMENT_STRATEGY_INVALID",
            "PLACEMENT_STRATEGY_PACK_HOST",
            "PLACEMENT_STRATEGY_SPREAD_JOB",
        ])? {
            2 => PlacementName::Spread,
            _ => PlacementName::Pack,
        },
    };
    f.finish()?;

    let daemon = job_type == JobTypeName::Daemon;
    let instances = match instance_count {
        Some(n) => n,
        None if daemon => 0,
        None => {
            // What the task config lacks first: it matters whatever the
            // count (Peloton's templates leave the count to a script).
            if let Some(config) = &default_config {
                task(&TaskView::read(config)?, &mut notes)?;
            }
            return fail(
                &count_path,
                "missing: the number of instances (a job here runs at least one)",
            );
        }
    };
    let (mut sla, sla_revocable) = match sla {
        Some(n) => sla_config(&n, &mut notes)?,
        None => (SlaFile::default(), false),
    };
    let Some(default_config) = default_config else {
        return fail(
            &default_path,
            "missing: the task config every instance runs",
        );
    };
    let default_view = TaskView::read(&default_config)?;
    let configs = match &instance_config {
        Some(n) => instance_configs(n)?,
        None => BTreeMap::new(),
    };
    for (instance, node) in &configs {
        if daemon {
            return fail(
                &node.path,
                "a daemon job runs one alike instance per host: it has no instance configs",
            );
        }
        if *instance >= instances {
            return fail(
                &node.path,
                format!("instance {instance} is not below instanceCount {instances}"),
            );
        }
    }
    // As Peloton does, what is checked is the config each instance runs:
    // the default config where it has none of its own, else the two merged.
    // A default config that no instance runs is not checked (the fields
    // every instance overrides may be placeholders), and the job's task is
    // then instance 0's.
    let runs_default = daemon || configs.len() < instances as usize;
    let default = match task(&default_view, &mut notes) {
        Ok(out) => Some(out),
        Err(e) if runs_default => return Err(e),
        Err(_) => None,
    };
    let mut own: Vec<(u32, TaskOut)> = Vec::with_capacity(configs.len());
    for (instance, node) in &configs {
        let view = default_view.merged(&TaskView::read(node)?)?;
        own.push((*instance, task(&view, &mut notes)?));
    }
    let mut default = match default {
        Some(default) if runs_default => default,
        // Every instance has a config of its own, so instance 0 has one.
        _ => own.remove(0).1,
    };
    // Each config that runs, with the instances it is for.
    let mut runs: Vec<(Who, &TaskOut)> = vec![(
        if runs_default {
            Who::Default
        } else {
            Who::One(0)
        },
        &default,
    )];
    runs.extend(own.iter().map(|(i, out)| (Who::One(*i), out)));
    let default_runner = (1..instances).find(|i| !configs.contains_key(i));
    let (controller, preemptible) =
        job_wide(&runs, instances, default_runner, job_type, &sla, &mut notes)?;
    for (instance, out) in &own {
        same_for_every_instance(&configs[instance].path, &default, out)?;
    }
    sla.preemptible = preemptible;
    for out in std::iter::once(&mut default).chain(own.iter_mut().map(|(_, out)| out)) {
        out.task.controller = controller == Controller::Job;
        out.task.revocable |= sla_revocable;
    }
    for (key, value, path) in &default.labels {
        labels.add(key, value.clone(), path)?;
    }
    let mut overrides: Vec<OverrideFile> = own
        .into_iter()
        .map(|(instance, out)| OverrideFile {
            instance,
            task: out.task,
        })
        .collect();
    if controller == Controller::Instance0 {
        // Instance 0 is the controller task, through its override (one
        // made from the default task if it runs that).
        if overrides.first().is_none_or(|o| o.instance != 0) {
            overrides.insert(
                0,
                OverrideFile {
                    instance: 0,
                    task: default.task.clone(),
                },
            );
        }
        overrides[0].task.controller = true;
    }
    let job_type = if job_type == JobTypeName::Service && default.task.volume.is_some() {
        // A service whose instances own volumes.
        JobTypeName::Stateful
    } else {
        job_type
    };
    let file = JobFile {
        name,
        owner: owner.unwrap_or_default(),
        labels: labels.0.into_iter().map(|(k, (v, _))| (k, v)).collect(),
        job_type,
        pool,
        instances,
        placement,
        sla,
        task: default.task,
        overrides,
        stateful: None,
        host_pool: String::new(),
        rendezvous: None,
        after: Default::default(),
        schedule: None,
    };
    Ok((file, notes))
}

/// The instances a task config is run by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// One instance, by its own config.
    One(u32),
    /// Those without a config of their own, by the default config.
    Default,
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::One(i) => write!(f, "instance {i}"),
            Who::Default => f.write_str("the instances without a config of their own"),
        }
    }
}

/// Which of a job's tasks are controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Controller {
    /// None.
    None,
    /// Every instance (the default task is one): a job of one instance, or
    /// a daemon's.
    Job,
    /// Instance 0 alone, through its override: a batch job's controller
    /// task, whose end is the job's.
    Instance0,
}

/// Which tasks are controllers, and whether the job is preemptible: set
/// once per job here, per task in Peloton. `default_runner` is the first
/// instance but 0 that runs the default config.
///
/// Controller: only instance 0 may be one, as in Peloton. A job of one
/// instance is then a controller job; a larger batch job has instance 0 as
/// its controller task (queued and capped as a controller, the others as
/// ordinary tasks; when it ends the others are stopped and the job ends as
/// it did). A larger service's instance 0 runs as an ordinary task (a
/// note), and a gang job cannot have one (a gang is queued as one entry).
///
/// Preemptible: a task's `preemptionPolicy.type` over the job's
/// `sla.preemptible`. Where they differ between instances, the job is
/// non-preemptible (a note names the instances): none of them is then
/// preempted, which is what those that asked for it were promised; the
/// others are admitted only within the pool's reservation.
/// `killOnPreempt` has no equivalent (a preempted task runs again here): a
/// note says so; a service may not set it, as in Peloton.
fn job_wide(
    runs: &[(Who, &TaskOut)],
    instances: u32,
    default_runner: Option<u32>,
    job_type: JobTypeName,
    sla: &SlaFile,
    notes: &mut Vec<Note>,
) -> Result<(Controller, bool)> {
    let sla_preemptible = sla.preemptible;
    let daemon = job_type == JobTypeName::Daemon;
    let mut controller = Controller::None;
    for (who, out) in runs {
        let Some(at) = &out.controller else {
            continue;
        };
        match who {
            _ if daemon => controller = Controller::Job,
            Who::One(0) => {}
            Who::One(_) => {
                return fail(
                    at,
                    "only instance 0 can be a controller task, as in Peloton",
                );
            }
            Who::Default => {
                if let Some(one) = default_runner {
                    return fail(
                        at,
                        format!(
                            "only instance 0 can be a controller task, as in Peloton, and instance {one} runs the default config"
                        ),
                    );
                }
            }
        }
        if daemon {
            continue;
        }
        if instances == 1 {
            controller = Controller::Job;
        } else if job_type != JobTypeName::Batch {
            note(
                notes,
                at,
                "instance 0 runs as an ordinary task: only a batch job's instance 0 may be a \
                 controller task here",
            );
        } else if sla.gang_size > 1 {
            return fail(
                at,
                format!(
                    "a gang job (sla.minimumRunningInstances {}) cannot have a controller task \
                     here: a gang is queued as one entry of one class",
                    sla.gang_size
                ),
            );
        } else {
            controller = Controller::Instance0;
        }
    }

    let preemptible_of = |out: &TaskOut| out.preemptible.as_ref().map_or(sla_preemptible, |p| p.0);
    let preemptible = runs.iter().all(|(_, out)| preemptible_of(out));
    let fixed: Vec<&(Who, &TaskOut)> = runs
        .iter()
        .filter(|(_, out)| !preemptible_of(out))
        .collect();
    if let Some((_, first)) = fixed.first()
        && fixed.len() < runs.len()
    {
        const SHOWN: usize = 8;
        let mut who: Vec<String> = fixed
            .iter()
            .take(SHOWN)
            .map(|(w, _)| w.to_string())
            .collect();
        if fixed.len() > SHOWN {
            who.push(format!("{} more", fixed.len() - SHOWN));
        }
        let at = first
            .preemptible
            .as_ref()
            .map_or("sla.preemptible", |p| p.1.as_str());
        note(
            notes,
            at,
            &format!(
                "non-preemptible for {}, and preemptibility is per job here: every instance of \
                 this job is non-preemptible (never preempted; admitted within the pool's reservation)",
                who.join(", ")
            ),
        );
    }
    for (_, out) in runs {
        let Some(at) = &out.kill_on_preempt else {
            continue;
        };
        if job_type != JobTypeName::Batch {
            return fail(at, "must be false but for a batch job, as in Peloton");
        }
        note(
            notes,
            at,
            if preemptible {
                "a preempted task runs again here once there is room (Peloton ends a \
                 preempted batch task as PREEMPTED)"
            } else {
                "no effect: this job is non-preemptible"
            },
        );
    }
    Ok((controller, preemptible))
}

/// What our API sets once per job must not differ between instances: an
/// instance's labels and revocability are the job task's.
fn same_for_every_instance(path: &str, job_task: &TaskOut, instance: &TaskOut) -> Result<()> {
    if instance.labels != job_task.labels {
        return fail(
            &join(path, "labels"),
            "per-instance labels have no equivalent here (labels belong to the job): give this instance the default config's labels, or none",
        );
    }
    let (mine, theirs) = (instance.task.revocable, job_task.task.revocable);
    if mine != theirs {
        return fail(
            &join(path, "revocable"),
            format!(
                "{mine} here (an instance config that leaves it out sets it to false, as in Peloton) \
                 but {theirs} for the job: every instance of a job has the same revocable here"
            ),
        );
    }
    Ok(())
}

/// `instanceConfig`: instance number → task config.
fn instance_configs<'a>(node: &Node<'a>) -> Result<BTreeMap<u32, Node<'a>>> {
    let Value::Mapping(map) = node.value else {
        return node.expected("a mapping of instance numbers to task configs");
    };
    let mut out: BTreeMap<u32, Node<'a>> = BTreeMap::new();
    for (key, value) in map {
        let text = key_text(key);
        let path = join(&node.path, &text);
        let Ok(instance) = text.trim().parse::<u32>() else {
            return fail(
                &path,
                "instance configs are keyed by instance number (0, 1, …)",
            );
        };
        if value.is_null() {
            continue;
        }
        if out.contains_key(&instance) {
            return fail(&path, format!("instance {instance} is given twice"));
        }
        out.insert(instance, Node { path, value });
    }
    Ok(out)
}

/// Peloton's `SlaConfig`; also whether it makes every task revocable.
fn sla_config(node: &Node<'_>, notes: &mut Vec<Note>) -> Result<(SlaFile, bool)> {
    let mut f = node.fields("Peloton's SlaConfig")?;
    let mut sla = SlaFile::default();
    let count = |n: Option<Node<'_>>| {
        n.map(|n| n.count())
            .transpose()
            .map(Option::unwrap_or_default)
    };
    let flag = |n: Option<Node<'_>>| {
        n.map(|n| n.boolean())
            .transpose()
            .map(Option::unwrap_or_default)
    };
    sla.priority = count(f.take("priority"))?;
    sla.preemptible = flag(f.take("preemptible"))?;
    let revocable = flag(f.take("revocable"))?;
    sla.max_running_instances = count(f.take("maximumrunninginstances"))?;
    // Admitted and placed together, all or nothing: a gang.
    sla.gang_size = count(f.take("minimumrunninginstances"))?;
    sla.max_running_time_ms = u64::from(count(f.take("maxrunningtime"))?) * 1000;
    sla.max_unavailable_instances = count(f.take("maximumunavailableinstances"))?;
    // Fields of older versions of SlaConfig, still in Peloton's examples;
    // its loader skips them, as unknown fields.
    for key in ["minimuminstancecount", "minimuminstancepercent"] {
        if let Some(n) = f.take(key) {
            n.number()?;
            note(
                notes,
                &n.path,
                "ignored: not a field of Peloton's SlaConfig any more (Peloton ignores it too); minimumRunningInstances makes a gang",
            );
        }
    }
    f.finish()?;
    Ok((sla, revocable))
}

/// The task-config fields of Peloton's v0 API.
const TASK_KEYS: [&str; 15] = [
    "name",
    "labels",
    "resource",
    "container",
    "command",
    "executor",
    "healthcheck",
    "ports",
    "constraint",
    "restartpolicy",
    "volume",
    "preemptionpolicy",
    "controller",
    "killgraceperiodseconds",
    "revocable",
];

/// A task config's fields; a merged view keeps each field's own path
/// (`defaultConfig.resource` for an inherited one).
#[derive(Clone, Debug)]
struct TaskView<'a> {
    path: String,
    fields: BTreeMap<&'static str, Node<'a>>,
}

impl<'a> TaskView<'a> {
    fn read(node: &Node<'a>) -> Result<Self> {
        let mut f = node.fields(TASK_CONFIG)?;
        let mut fields = BTreeMap::new();
        for key in TASK_KEYS {
            if let Some(n) = f.take(key) {
                fields.insert(key, n);
            }
        }
        f.finish()?;
        Ok(TaskView {
            path: node.path.clone(),
            fields,
        })
    }

    /// An instance config over this (default) config, as Peloton's
    /// `taskconfig.Merge` does it: top-level fields only; booleans always
    /// from the instance config (unset: false); numbers and strings from it
    /// unless 0 or empty; anything else from it when it is given.
    fn merged(&self, over: &TaskView<'a>) -> Result<TaskView<'a>> {
        let mut merged = self.clone();
        merged.path.clone_from(&over.path);
        for key in ["controller", "revocable"] {
            merged.fields.remove(key);
        }
        for (key, node) in &over.fields {
            let replace = match *key {
                "killgraceperiodseconds" => node.count()? != 0,
                "name" => !node.string()?.is_empty(),
                _ => true,
            };
            if replace {
                merged.fields.insert(key, node.clone());
            }
        }
        Ok(merged)
    }

    fn get(&self, key: &str) -> Option<&Node<'a>> {
        self.fields.get(key)
    }
}

/// One task config, mapped.
#[derive(Clone, Debug)]
struct TaskOut {
    task: TaskFile,
    /// Key, value, path.
    labels: Vec<(String, String, String)>,
    /// `preemptionPolicy.type`, if it says, and its path.
    preemptible: Option<(bool, String)>,
    /// The path of `preemptionPolicy.killOnPreempt` where it is true.
    kill_on_preempt: Option<String>,
    /// The path of `controller` where it is true.
    controller: Option<String>,
}

/// `PELOTON_PORT_<NAME>`, as the agent names a port's variable: the name
/// upper-cased, anything but ASCII letters and digits turned into `_`.
pub fn port_env_name(name: &str) -> String {
    let mut env = String::from("PELOTON_PORT_");
    env.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    env
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A word for `/bin/sh`, quoted unless it is plainly safe.
fn sh_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c));
    if safe {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn task(view: &TaskView<'_>, notes: &mut Vec<Note>) -> Result<TaskOut> {
    if let Some(n) = view.get("container") {
        return fail(
            &n.path,
            "container images (Docker or Mesos) are not supported: tasks run as plain processes on \
             the agent's host; remove `container` and run the command directly (its programs must \
             be installed on the hosts)",
        );
    }
    if let Some(n) = view.get("executor") {
        return fail(
            &n.path,
            "custom Mesos executors are not supported: the agent runs each task as a plain process",
        );
    }
    let mut task = TaskFile::default();
    let labels = match view.get("labels") {
        Some(n) => label_list(n)?,
        None => Vec::new(),
    };
    if let Some(n) = view.get("resource") {
        let mut f = n.fields("Peloton's ResourceConfig")?;
        let mut number = |key: &str| f.take(key).map(|n| n.number()).transpose();
        task.resources = ResourcesFile {
            cpu: number("cpulimit")?.unwrap_or_default(),
            // Peloton's MB are taken as MiB.
            memory_mb: number("memlimitmb")?.unwrap_or_default(),
            disk_mb: number("disklimitmb")?.unwrap_or_default(),
            gpu: number("gpulimit")?.unwrap_or_default(),
        };
        if let Some(fd) = f.take("fdlimit") {
            fd.count()?;
            // Peloton never passes it to Mesos (its host manager has no
            // such resource).
            note(
                notes,
                &fd.path,
                "ignored, as Peloton ignores it (it never reaches Mesos): every task gets its agent's open-file limit \
                 (RLIMIT_NOFILE, the agent's --open-files, 65,536 by default)",
            );
        }
        f.finish()?;
    }
    // Ports, and the variables Peloton names them by.
    let mut exports = String::new();
    if let Some(n) = view.get("ports") {
        for item in n.list()? {
            let mut f = item.fields("Peloton's PortConfig")?;
            let name_path = f.path_of("name");
            let name = f.take("name").map(|n| n.string()).transpose()?;
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                return fail(&name_path, "missing: the port's name");
            };
            if let Some(value) = f.take("value")
                && value.count()? != 0
            {
                return fail(
                    &value.path,
                    "static ports are not supported: the agent assigns ports from its range; \
                     leave `value` out for a dynamic port",
                );
            }
            if let Some(env) = f.take("envname") {
                let env_name = env.string()?;
                let ours = port_env_name(&name);
                if !env_name.is_empty() && env_name != ours {
                    if !is_env_name(&env_name) {
                        return fail(
                            &env.path,
                            format!("{env_name:?} is not an environment variable name"),
                        );
                    }
                    exports.push_str(&format!("export {env_name}=\"${ours}\"; "));
                }
            }
            f.finish()?;
            task.ports.push(name);
        }
    }
    match view.get("command") {
        None => {
            return fail(
                &join(&view.path, "command"),
                "missing: the command the task runs",
            );
        }
        Some(n) => command(n, &exports, &mut task, notes)?,
    }
    if let Some(n) = view.get("healthcheck") {
        task.health_check = health_check(n, &exports)?;
    }
    if let Some(n) = view.get("constraint") {
        let placement = constraint(n, &labels, true, 0)?;
        match placement {
            Placement::Any => {}
            Placement::Hosts(expr) => task.constraint = expr,
            Placement::PerHost(max) => task.max_instances_per_host = max,
            Placement::Both(expr, max) => {
                task.constraint = expr;
                task.max_instances_per_host = max;
            }
        }
        if task.max_instances_per_host != 0 {
            note(
                notes,
                &n.path,
                "a task-label constraint counts only this job's instances here (a per-host limit); Peloton counted every task with that label",
            );
        }
    }
    if let Some(n) = view.get("restartpolicy") {
        let mut f = n.fields("Peloton's RestartPolicy")?;
        if let Some(m) = f.take("maxfailures") {
            task.restart.max_failures = m.count()?;
        }
        f.finish()?;
    }
    if let Some(n) = view.get("volume") {
        let mut f = n.fields("Peloton's PersistentVolumeConfig")?;
        let path = f.take("containerpath").map(|n| n.string()).transpose()?;
        let size = f.take("sizemb").map(|n| n.count()).transpose()?;
        f.finish()?;
        task.volume = Some(VolumeFile {
            size_mb: u64::from(size.unwrap_or_default()),
            path: path.unwrap_or_default(),
        });
    }
    let mut preemptible = None;
    let mut kill_on_preempt = None;
    if let Some(n) = view.get("preemptionpolicy") {
        let mut f = n.fields("Peloton's PreemptionPolicy")?;
        if let Some(t) = f.take("type") {
            match t.choice(&["TYPE_INVALID", "TYPE_PREEMPTIBLE", "TYPE_NON_PREEMPTIBLE"])? {
                1 => preemptible = Some((true, t.path)),
                2 => preemptible = Some((false, t.path)),
                _ => {}
            }
        }
        if let Some(k) = f.take("killonpreempt")
            && k.boolean()?
        {
            kill_on_preempt = Some(k.path);
        }
        f.finish()?;
    }
    let controller = view.get("controller");
    task.controller = controller.map_or(Ok(false), Node::boolean)?;
    task.revocable = view.get("revocable").map_or(Ok(false), Node::boolean)?;
    // Peloton's default grace period is 30 s.
    let grace_s = view
        .get("killgraceperiodseconds")
        .map_or(Ok(0), Node::count)?;
    task.kill_grace_period_ms = u64::from(if grace_s == 0 { 30 } else { grace_s }) * 1000;
    Ok(TaskOut {
        controller: controller
            .filter(|_| task.controller)
            .map(|n| n.path.clone()),
        task,
        labels,
        preemptible,
        kill_on_preempt,
    })
}

/// Mesos' `CommandInfo`: a shell line (`shell: true`, the default) or a
/// program and its argv (`shell: false`; `arguments[0]` is argv[0]).
fn command(
    node: &Node<'_>,
    exports: &str,
    task: &mut TaskFile,
    notes: &mut Vec<Note>,
) -> Result<()> {
    let mut f = node.fields("Mesos' CommandInfo (value, shell, arguments, environment)")?;
    let value_path = f.path_of("value");
    let value = f.take("value").map(|n| n.string()).transpose()?;
    let shell = f.take("shell").map(|n| n.boolean()).transpose()?;
    let arguments = match f.take("arguments") {
        Some(n) => n
            .list()?
            .into_iter()
            .map(|a| Ok((a.string()?, a.path)))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    if let Some(n) = f.take("environment") {
        let mut env = n.fields("Mesos' Environment (variables)")?;
        if let Some(vars) = env.take("variables") {
            for var in vars.list()? {
                let mut v = var.fields("Mesos' Environment.Variable (name, value)")?;
                let name_path = v.path_of("name");
                let name = v.take("name").map(|n| n.string()).transpose()?;
                if let Some(t) = v.take("type")
                    && t.choice(&["UNKNOWN", "VALUE", "SECRET"])? == 2
                {
                    return fail(
                        &t.path,
                        "secret variables are not supported here: deliver secrets with `peloton job create --secret NAME=FILE`",
                    );
                }
                if let Some(s) = v.take("secret") {
                    return fail(
                        &s.path,
                        "secret variables are not supported here: deliver secrets with `peloton job create --secret NAME=FILE`",
                    );
                }
                let value = v.take("value").map(|n| n.string()).transpose()?;
                v.finish()?;
                let Some(name) = name.filter(|n| !n.is_empty()) else {
                    return fail(&name_path, "missing: the variable's name");
                };
                if task.env.contains_key(&name) {
                    return fail(&name_path, format!("variable {name:?} is given twice"));
                }
                task.env.insert(name, value.unwrap_or_default());
            }
        }
        env.finish()?;
    }
    if let Some(n) = f.take("uris")
        && !n.list()?.is_empty()
    {
        return fail(
            &n.path,
            "fetching URIs into the sandbox is not supported: have the command fetch what it \
             needs, or install it on the hosts",
        );
    }
    if let Some(n) = f.take("user") {
        return fail(
            &n.path,
            "running a task as another user is not supported: tasks run as the agent's user",
        );
    }
    f.finish()?;
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return fail(
            &value_path,
            "missing: the shell line (shell: true) or the program (shell: false)",
        );
    };
    if shell.unwrap_or(true) {
        if let Some((_, path)) = arguments.first() {
            return fail(
                path,
                "Mesos ignores arguments when shell is true: put them in value, or set shell: false",
            );
        }
        task.shell = format!("{exports}{value}");
        return Ok(());
    }
    if let Some((first, path)) = arguments.first()
        && *first != value
    {
        note(
            notes,
            path,
            "argv[0] in Mesos, not passed: here the program's argv[0] is its own name",
        );
    }
    let args: Vec<String> = arguments.into_iter().skip(1).map(|(a, _)| a).collect();
    if exports.is_empty() {
        task.command = value;
        task.args = args;
    } else {
        // The port variables need a shell; the program still replaces it.
        let words: Vec<String> = std::iter::once(&value)
            .chain(&args)
            .map(|w| sh_quote(w))
            .collect();
        task.shell = format!("{exports}exec {}", words.join(" "));
    }
    Ok(())
}

/// Peloton's `HealthCheckConfig`: command checks; 0 means Mesos' defaults,
/// written out (15 s before the first check, every 10 s, 20 s timeout, 3
/// failures). `enabled: false` means no health check: the other fields
/// must still be fields of the config, but are not used.
fn health_check(node: &Node<'_>, exports: &str) -> Result<Option<HealthCheckFile>> {
    const HTTP: &str = "HTTP checks name a fixed port number, and ports here are assigned by the \
                        agent: use a commandCheck such as `curl -fsS http://127.0.0.1:$PORT_VAR/`";
    let mut f = node.fields("Peloton's HealthCheckConfig")?;
    if let Some(n) = f.take("enabled")
        && !n.boolean()?
    {
        for key in [
            "initialintervalsecs",
            "intervalsecs",
            "timeoutsecs",
            "maxconsecutivefailures",
            "type",
            "httpcheck",
            "commandcheck",
        ] {
            f.take(key);
        }
        f.finish()?;
        return Ok(None);
    }
    let mut secs = |key: &str, default: u32| -> Result<u64> {
        let v = f.take(key).map(|n| n.count()).transpose()?.unwrap_or(0);
        Ok(u64::from(if v == 0 { default } else { v }) * 1000)
    };
    let initial_delay_ms = secs("initialintervalsecs", 15)?;
    let interval_ms = secs("intervalsecs", 10)?;
    let timeout_ms = secs("timeoutsecs", 20)?;
    let failures = f
        .take("maxconsecutivefailures")
        .map(|n| n.count())
        .transpose()?
        .unwrap_or(0);
    let type_path = f.path_of("type");
    let kind = f
        .take("type")
        .map(|n| n.choice(&["UNKNOWN", "COMMAND", "HTTP", "GRPC"]))
        .transpose()?;
    if let Some(n) = f.take("httpcheck") {
        return fail(&n.path, HTTP);
    }
    let check = f.take("commandcheck");
    f.finish()?;
    match kind {
        Some(2) => return fail(&type_path, HTTP),
        Some(3) => {
            return fail(
                &type_path,
                "gRPC health checks are not supported: use a commandCheck",
            );
        }
        _ => {}
    }
    let Some(check) = check else {
        return fail(
            &join(&node.path, "commandCheck"),
            "missing: the check's command (COMMAND is the kind of check supported)",
        );
    };
    let mut c = check.fields("Peloton's HealthCheckConfig.CommandCheck")?;
    let command_path = c.path_of("command");
    let command = c.take("command").map(|n| n.string()).transpose()?;
    if let Some(n) = c.take("unshareenvironments")
        && n.boolean()?
    {
        return fail(
            &n.path,
            "a health check runs with the task's environment here; there is no unshared mode",
        );
    }
    c.finish()?;
    let Some(command) = command.filter(|c| !c.trim().is_empty()) else {
        return fail(&command_path, "missing: the command to run");
    };
    Ok(Some(HealthCheckFile {
        command: Some(format!("{exports}{command}")),
        http: None,
        tcp_port: None,
        initial_delay_ms,
        interval_ms,
        timeout_ms,
        max_consecutive_failures: if failures == 0 { 3 } else { failures },
    }))
}

/// What a constraint becomes: a host expression, a limit of instances per
/// host (from a task-label constraint), both, or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placement {
    Any,
    Hosts(String),
    PerHost(u32),
    Both(String, u32),
}

impl Placement {
    fn and(self, other: Placement) -> Placement {
        let (h1, p1) = self.parts();
        let (h2, p2) = other.parts();
        let hosts = match (h1, h2) {
            (Some(a), Some(b)) => Some(format!("({a}) and ({b})")),
            (a, b) => a.or(b),
        };
        let per_host = match (p1, p2) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Placement::from_parts(hosts, per_host)
    }

    fn parts(self) -> (Option<String>, Option<u32>) {
        match self {
            Placement::Any => (None, None),
            Placement::Hosts(h) => (Some(h), None),
            Placement::PerHost(p) => (None, Some(p)),
            Placement::Both(h, p) => (Some(h), Some(p)),
        }
    }

    fn from_parts(hosts: Option<String>, per_host: Option<u32>) -> Placement {
        match (hosts, per_host) {
            (None, None) => Placement::Any,
            (Some(h), None) => Placement::Hosts(h),
            (None, Some(p)) => Placement::PerHost(p),
            (Some(h), Some(p)) => Placement::Both(h, p),
        }
    }
}

/// A word of the constraint language, quoted unless plain.
fn constraint_word(path: &str, word: &str) -> Result<String> {
    if word.contains('"') {
        return fail(
            path,
            format!("{word:?}: constraints cannot match a double quote"),
        );
    }
    let plain = !word.is_empty()
        && !matches!(word, "and" | "or" | "not" | "in" | "exists")
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-/:".contains(c));
    Ok(if plain {
        word.to_owned()
    } else {
        format!("\"{word}\"")
    })
}

/// Peloton's `Constraint` (label, and, or) as our constraint expression.
/// Host labels are host attributes (`hostname` is `host`); a task-label
/// constraint on one of the task's own labels, "no other such task" or
/// "fewer than N", is a limit of the job's instances per host, and only at
/// the top or in a top-level AND.
fn constraint(
    node: &Node<'_>,
    own_labels: &[(String, String, String)],
    top: bool,
    depth: usize,
) -> Result<Placement> {
    if depth > 32 {
        return fail(&node.path, "nested more than 32 deep");
    }
    let mut f = node.fields("Peloton's Constraint")?;
    let type_path = f.path_of("type");
    let kind = f
        .take("type")
        .map(|n| {
            n.choice(&[
                "UNKNOWN_CONSTRAINT",
                "LABEL_CONSTRAINT",
                "AND_CONSTRAINT",
                "OR_CONSTRAINT",
            ])
        })
        .transpose()?;
    let label = f.take("labelconstraint");
    let and = f.take("andconstraint");
    let or = f.take("orconstraint");
    f.finish()?;
    // A missing type is read from the one part that is given.
    let kind = match kind {
        Some(k) if k != 0 => k,
        _ => match (&label, &and, &or) {
            (Some(_), None, None) => 1,
            (None, Some(_), None) => 2,
            (None, None, Some(_)) => 3,
            _ => {
                return fail(
                    &type_path,
                    "missing: LABEL_CONSTRAINT (1), AND_CONSTRAINT (2) or OR_CONSTRAINT (3)",
                );
            }
        },
    };
    match kind {
        1 => {
            let Some(label) = label else {
                return fail(&join(&node.path, "labelConstraint"), "missing");
            };
            label_constraint(&label, own_labels, top)
        }
        2 | 3 => {
            let (name, list) = if kind == 2 {
                ("andConstraint", and)
            } else {
                ("orConstraint", or)
            };
            let Some(list) = list else {
                return fail(&join(&node.path, name), "missing");
            };
            let mut lf = list.fields("Peloton's AndConstraint/OrConstraint (constraints)")?;
            let items = lf.take("constraints").map(|n| n.list()).transpose()?;
            lf.finish()?;
            let items = items.unwrap_or_default();
            if kind == 2 {
                let mut out = Placement::Any;
                for item in &items {
                    out = out.and(constraint(item, own_labels, top, depth + 1)?);
                }
                return Ok(out);
            }
            let mut hosts = Vec::new();
            for item in &items {
                match constraint(item, own_labels, false, depth + 1)? {
                    Placement::Hosts(h) => hosts.push(format!("({h})")),
                    // One branch that always holds makes the whole OR hold.
                    Placement::Any => return Ok(Placement::Any),
                    Placement::PerHost(_) | Placement::Both(..) => unreachable!("not at the top"),
                }
            }
            if hosts.is_empty() {
                return fail(&list.path, "an OR of no constraints can never hold");
            }
            Ok(Placement::Hosts(hosts.join(" or ")))
        }
        _ => fail(
            &type_path,
            "must be LABEL_CONSTRAINT, AND_CONSTRAINT or OR_CONSTRAINT",
        ),
    }
}

fn label_constraint(
    node: &Node<'_>,
    own_labels: &[(String, String, String)],
    top: bool,
) -> Result<Placement> {
    let mut f = node.fields("Peloton's LabelConstraint")?;
    let kind_path = f.path_of("kind");
    let kind = f
        .take("kind")
        .map(|n| n.choice(&["UNKNOWN", "TASK", "HOST"]))
        .transpose()?
        .unwrap_or(0);
    let condition_path = f.path_of("condition");
    let condition = f
        .take("condition")
        .map(|n| {
            n.choice(&[
                "CONDITION_UNKNOWN",
                "CONDITION_LESS_THAN",
                "CONDITION_EQUAL",
                "CONDITION_GREATER_THAN",
            ])
        })
        .transpose()?
        .unwrap_or(0);
    let label_path = f.path_of("label");
    let label = f.take("label");
    let requirement_path = f.path_of("requirement");
    let requirement = f
        .take("requirement")
        .map(|n| n.count())
        .transpose()?
        .unwrap_or(0);
    f.finish()?;
    let Some(label) = label else {
        return fail(&label_path, "missing: the label {key, value}");
    };
    let mut lf = label.fields("Peloton's Label (key, value)")?;
    let key_path = lf.path_of("key");
    let key = lf.take("key").map(|n| n.string()).transpose()?;
    let value = lf
        .take("value")
        .map(|n| n.string())
        .transpose()?
        .unwrap_or_default();
    lf.finish()?;
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return fail(&key_path, "missing");
    };
    const LESS: usize = 1;
    const EQUAL: usize = 2;
    const GREATER: usize = 3;
    match kind {
        // HOST: the host's attribute; a host has at most one value of it,
        // so the count of the label is 0 or 1.
        2 => {
            let attribute = if key == "hostname" { "host" } else { &key };
            let k = constraint_word(&key_path, attribute)?;
            let v = constraint_word(&label.path, &value)?;
            match (condition, requirement) {
                (EQUAL, 1) | (GREATER, 0) => Ok(Placement::Hosts(format!("{k} == {v}"))),
                (EQUAL, 0) | (LESS, 1) => Ok(Placement::Hosts(format!("{k} != {v}"))),
                (LESS, r) if r >= 2 => Ok(Placement::Any),
                (0, _) => fail(
                    &condition_path,
                    "missing: CONDITION_LESS_THAN (1), CONDITION_EQUAL (2) or CONDITION_GREATER_THAN (3)",
                ),
                _ => fail(
                    &requirement_path,
                    format!(
                        "{requirement}: can never hold, as a host has at most one value of an attribute here"
                    ),
                ),
            }
        }
        // TASK: how many tasks with the label the host runs.
        1 => {
            if !top {
                return fail(
                    &node.path,
                    "a task-label constraint has an equivalent (a limit of instances per host) only at the top, or in a top-level AND",
                );
            }
            if !own_labels.iter().any(|(k, v, _)| *k == key && *v == value) {
                return fail(
                    &label.path,
                    format!(
                        "{key}={value} is not one of this task's labels: a task-label constraint has an equivalent here only as a limit of the job's own instances per host"
                    ),
                );
            }
            match (condition, requirement) {
                (EQUAL, 0) => Ok(Placement::PerHost(1)),
                (LESS, r) if r >= 1 => Ok(Placement::PerHost(r)),
                _ => fail(
                    &condition_path,
                    "only CONDITION_EQUAL 0 (no other such instance on the host) and CONDITION_LESS_THAN N (fewer than N) have an equivalent: a limit of instances per host",
                ),
            }
        }
        _ => fail(&kind_path, "missing: TASK (1) or HOST (2)"),
    }
}

// ---------------------------------------------------------------- pools

const POOL_CONFIG: &str = "Peloton's resource pool config (ResourcePoolConfig)";
/// Peloton's resource kinds, in our dimensions' order.
const KINDS: [&str; 4] = ["cpu", "memory", "disk", "gpu"];
/// The smallest limit of each dimension (cores, MiB, MiB, GPUs): stands
/// for Peloton's limit 0 ("none"), as 0 means "no limit" here.
const SMALLEST: [f64; 4] = [0.001, 1.0, 1.0, 0.001];
/// The smallest percentage, for Peloton's 0 percent.
const SMALLEST_PCT: f64 = 0.001;

/// One entry of a pool's `resources`.
struct KindEntry {
    reservation: f64,
    limit: f64,
    share: f64,
    /// UNKNOWN_TYPE (0), ELASTIC (1) or STATIC (2).
    reservation_type: usize,
    type_path: String,
    /// The entry's path (`resources[2]`).
    path: String,
}

/// Reads Peloton's resource pool config into a native pool. `path` (the
/// command line's pool path, as Peloton's CLI takes it) must end in the
/// config's name; without it the path is the config's `parent` (or /) and
/// its name.
pub fn pool(root: &Value, path: Option<&str>) -> Result<(PoolFile, Vec<Note>)> {
    let mut notes = Vec::new();
    let mut f = Node::root(root).fields(POOL_CONFIG)?;
    if let Some(n) = f.take("changelog") {
        note(
            &mut notes,
            &n.path,
            "ignored: a version record that the server keeps",
        );
    }
    let name_path = f.path_of("name");
    let name = f.take("name").map(|n| n.string()).transpose()?;
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return fail(&name_path, "missing: the pool's name");
    };
    for key in ["owningteam", "ldapgroups", "description"] {
        if let Some(n) = f.take(key) {
            match n.value {
                Value::Sequence(_) => {
                    n.list()?
                        .iter()
                        .map(Node::string)
                        .collect::<Result<Vec<_>>>()?;
                }
                _ => {
                    n.string()?;
                }
            }
            note(&mut notes, &n.path, "ignored: pools have no labels here");
        }
    }
    let resources = f.take("resources");
    let parent = f.take("parent").map(|n| pool_path(&n)).transpose()?;
    if let Some(n) = f.take("policy") {
        // Highest priority first, then first come first served: what every
        // pool's queues do here.
        n.choice(&["UNKNOWN", "PriorityFIFO"])?;
    }
    let mut percent = |key: &str| -> Result<(f64, Option<String>)> {
        let Some(n) = f.take(key) else {
            return Ok((0.0, None));
        };
        let mut lf = n.fields("Peloton's limit (maxPercent)")?;
        let value = lf.take("maxpercent");
        lf.finish()?;
        let Some(value) = value else {
            return Ok((0.0, None));
        };
        let pct = value.number()?;
        if pct > 100.0 {
            return fail(&value.path, format!("must be 0–100 (got {pct})"));
        }
        Ok((pct, Some(value.path)))
    };
    let (controller_pct, controller_path) = percent("controllerlimit")?;
    let (slack_pct, slack_path) = percent("slacklimit")?;
    f.finish()?;

    let path = match (path, &parent) {
        (Some(path), parent) => {
            let (up, last) = path.rsplit_once('/').unwrap_or(("", path));
            if last != name {
                return fail(
                    &name_path,
                    format!(
                        "{name:?} does not match the pool path {path} (its last part is {last:?})"
                    ),
                );
            }
            let up = if up.is_empty() { "/" } else { up };
            if let Some((parent, parent_path)) = parent
                && parent != up
            {
                return fail(
                    parent_path,
                    format!("{parent} is not the parent of the pool path {path}"),
                );
            }
            path.to_owned()
        }
        (None, Some((parent, _))) if parent != "/" => format!("{parent}/{name}"),
        (None, _) => format!("/{name}"),
    };

    // Per kind, as listed; Peloton's defaults for a kind not listed are a
    // reservation and limit of 0 and a share of 1.
    let mut given: [Option<KindEntry>; 4] = Default::default();
    if let Some(resources) = &resources {
        for item in resources.list()? {
            let mut rf =
                item.fields("Peloton's ResourceConfig (kind, reservation, limit, share, type)")?;
            let kind_path = rf.path_of("kind");
            let kind = rf.take("kind").map(|n| n.string()).transpose()?;
            let mut number = |key: &str| rf.take(key).map(|n| n.number()).transpose();
            let reservation = number("reservation")?.unwrap_or(0.0);
            let limit = number("limit")?.unwrap_or(0.0);
            let share = number("share")?.unwrap_or(0.0);
            let type_path = rf.path_of("type");
            let reservation_type = rf
                .take("type")
                .map(|n| n.choice(&["UNKNOWN_TYPE", "ELASTIC", "STATIC"]))
                .transpose()?
                .unwrap_or(0);
            rf.finish()?;
            let Some(kind) = kind else {
                return fail(&kind_path, "missing: cpu, memory, disk or gpu");
            };
            let Some(d) = KINDS.iter().position(|k| k.eq_ignore_ascii_case(&kind)) else {
                return fail(
                    &kind_path,
                    format!("unknown kind {kind:?}; one of cpu, memory, disk, gpu"),
                );
            };
            if given[d].is_some() {
                return fail(&kind_path, format!("{kind} is given twice"));
            }
            if limit < reservation {
                return fail(
                    &item.path,
                    format!("reservation {reservation} exceeds limit {limit}"),
                );
            }
            given[d] = Some(KindEntry {
                reservation,
                limit,
                share,
                reservation_type,
                type_path,
                path: item.path.clone(),
            });
        }
    }
    let resources_path = resources
        .as_ref()
        .map_or_else(|| "resources".to_owned(), |n| n.path.clone());
    let mut reservation = [0.0; 4];
    let mut limit = [0.0; 4];
    let mut shares = [1.0; 4];
    let mut pool_type: Option<(usize, String)> = None;
    for d in 0..4 {
        match &given[d] {
            Some(entry) => {
                reservation[d] = entry.reservation;
                limit[d] = entry.limit;
                if entry.share != 0.0 {
                    shares[d] = entry.share;
                }
                // UNKNOWN_TYPE is ELASTIC, Peloton's default.
                let t = entry.reservation_type.max(1);
                let type_path = &entry.type_path;
                match &pool_type {
                    Some((first, first_path)) if *first != t => {
                        return fail(
                            type_path,
                            format!(
                                "every kind of a pool has the same reservation type here (ELASTIC or STATIC), and {first_path} differs"
                            ),
                        );
                    }
                    Some(_) => {}
                    None => pool_type = Some((t, type_path.clone())),
                }
                if entry.limit == 0.0 {
                    limit[d] = SMALLEST[d];
                    note(
                        &mut notes,
                        &join(&entry.path, "limit"),
                        &format!(
                            "{}: Peloton's limit 0 (none) is written as the smallest limit, {} (0 means no limit here)",
                            KINDS[d], SMALLEST[d]
                        ),
                    );
                }
            }
            None => {
                limit[d] = SMALLEST[d];
                note(
                    &mut notes,
                    &resources_path,
                    &format!(
                        "no {} entry: Peloton's limit for it is 0 (none), written as the smallest limit, {}",
                        KINDS[d], SMALLEST[d]
                    ),
                );
            }
        }
    }
    let pct = |value: f64, at: Option<String>, notes: &mut Vec<Note>| match at {
        Some(at) if value == 0.0 => {
            note(
                notes,
                &at,
                &format!(
                    "Peloton's 0 percent (none) is written as the smallest, {SMALLEST_PCT} (0 means 100 here)"
                ),
            );
            SMALLEST_PCT
        }
        _ => value,
    };
    let controller_limit_pct = pct(controller_pct, controller_path, &mut notes);
    let slack_limit_pct = pct(slack_pct, slack_path, &mut notes);
    let resources_of = |v: [f64; 4]| ResourcesFile {
        cpu: v[0],
        memory_mb: v[1],
        disk_mb: v[2],
        gpu: v[3],
    };
    let same_share = shares.iter().all(|s| *s == shares[0]);
    let file = PoolFile {
        path,
        reservation: resources_of(reservation),
        limit: resources_of(limit),
        share: if same_share && shares[0] != 1.0 {
            shares[0]
        } else {
            0.0
        },
        shares: (!same_share).then(|| resources_of(shares)),
        kind: match pool_type {
            Some((2, _)) => PoolKindName::Static,
            _ => PoolKindName::Elastic,
        },
        controller_limit_pct,
        slack_limit_pct,
        // Uber Peloton's pools have no such setting.
        strict_order: false,
    };
    Ok((file, notes))
}

// ---------------------------------------------------------------- output

/// The native YAML of a converted file, headed by comments: where it came
/// from and the notes.
pub fn render<T: serde::Serialize>(
    body: &T,
    what: &str,
    origin: &str,
    notes: &[Note],
) -> std::result::Result<String, serde_norway::Error> {
    let one_line = |s: &str| s.replace(['\n', '\r'], " ");
    let mut out = format!(
        "# {what}, converted from Peloton's format ({}) by `peloton convert`.\n",
        one_line(origin)
    );
    if !notes.is_empty() {
        out.push_str("# Notes:\n");
        for n in notes {
            out.push_str(&format!("#   {}\n", one_line(&n.to_string())));
        }
    }
    out.push_str(&serde_norway::to_string(body)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RestartFile;

    fn value(text: &str) -> Value {
        serde_norway::from_str(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn job_of(text: &str) -> (JobFile, Vec<Note>) {
        job(&value(text)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn job_error(text: &str) -> String {
        match job(&value(text)) {
            Ok(file) => panic!("accepted: {file:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn pool_of(text: &str, path: Option<&str>) -> (PoolFile, Vec<Note>) {
        pool(&value(text), path).unwrap_or_else(|e| panic!("{e}"))
    }

    fn pool_error(text: &str, path: Option<&str>) -> String {
        match pool(&value(text), path) {
            Ok(file) => panic!("accepted: {file:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn notes_text(notes: &[Note]) -> Vec<String> {
        notes.iter().map(Note::to_string).collect()
    }

    const FULL_JOB: &str = r#"
changeLog: {version: 3}
name: full
type: SERVICE
owningTeam: team6
ldapGroups: [money, otto]
description: "every field"
labels:
- {key: k1, value: v1}
- {key: k2, value: 2}
instanceCount: 4
respoolID: {value: /prod/web}
owner: alice
placementStrategy: PLACEMENT_STRATEGY_SPREAD_JOB
sla:
  priority: 22
  preemptible: true
  revocable: false
  maximumRunningInstances: 3
  minimumRunningInstances: 2
  maxRunningTime: 300
  maximumUnavailableInstances: 1
defaultConfig:
  name: task
  labels: [{key: app, value: web}]
  resource: {cpuLimit: 0.5, memLimitMb: 256, diskLimitMb: 100, gpuLimit: 1}
  container: null
  executor: null
  command:
    shell: true
    value: 'echo hi'
    environment:
      variables:
      - {name: A, value: "1"}
      - {name: B, value: two, type: VALUE}
    uris: []
  healthCheck:
    enabled: true
    type: COMMAND
    initialIntervalSecs: 5
    intervalSecs: 6
    timeoutSecs: 7
    maxConsecutiveFailures: 8
    commandCheck: {command: 'true', unshareEnvironments: false}
  ports:
  - {name: http}
  - {name: admin, envName: PELOTON_PORT_ADMIN}
  constraint:
    type: LABEL_CONSTRAINT
    labelConstraint:
      kind: HOST
      condition: CONDITION_EQUAL
      requirement: 1
      label: {key: zone, value: z1}
  restartPolicy: {maxFailures: 4}
  preemptionPolicy: {type: TYPE_PREEMPTIBLE, killOnPreempt: false}
  controller: false
  killGracePeriodSeconds: 9
  revocable: false
"#;

    #[test]
    fn every_job_field_maps() {
        let (file, notes) = job_of(FULL_JOB);
        assert_eq!(file.name, "full");
        assert_eq!(file.job_type, JobTypeName::Service);
        assert_eq!(file.owner, "alice");
        assert_eq!(file.pool, "/prod/web");
        assert_eq!(file.instances, 4);
        assert_eq!(file.placement, PlacementName::Spread);
        let labels: Vec<(&str, &str)> = file
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("app", "web"),
                ("k1", "v1"),
                ("k2", "2"),
                (DESCRIPTION_LABEL, "every field"),
                (LDAP_GROUPS_LABEL, "money,otto"),
                (OWNING_TEAM_LABEL, "team6"),
            ]
        );
        assert_eq!(
            file.sla,
            SlaFile {
                priority: 22,
                preemptible: true,
                max_running_instances: 3,
                gang_size: 2,
                max_running_time_ms: 300_000,
                max_unavailable_instances: 1,
                elastic_min: 0,
            }
        );
        let t = &file.task;
        assert_eq!(t.shell, "echo hi");
        assert_eq!((t.command.as_str(), t.args.len()), ("", 0));
        assert_eq!(
            t.env.iter().collect::<Vec<_>>(),
            [
                (&"A".to_owned(), &"1".to_owned()),
                (&"B".to_owned(), &"two".to_owned())
            ]
        );
        assert_eq!(
            t.resources,
            ResourcesFile {
                cpu: 0.5,
                memory_mb: 256.0,
                disk_mb: 100.0,
                gpu: 1.0
            }
        );
        assert_eq!(t.ports, ["http", "admin"]);
        assert_eq!(t.constraint, "zone == z1");
        assert_eq!(t.max_instances_per_host, 0);
        assert_eq!(
            t.restart,
            RestartFile {
                max_failures: 4,
                ..Default::default()
            }
        );
        assert!(!t.revocable && !t.controller);
        assert_eq!(t.kill_grace_period_ms, 9000);
        assert_eq!(
            t.health_check,
            Some(HealthCheckFile {
                command: Some("true".into()),
                initial_delay_ms: 5000,
                interval_ms: 6000,
                timeout_ms: 7000,
                max_consecutive_failures: 8,
                ..Default::default()
            })
        );
        assert!(file.overrides.is_empty());
        assert_eq!(
            notes_text(&notes),
            ["changeLog: ignored: a version record that the server keeps",]
        );
    }

    #[test]
    fn keys_match_in_any_case() {
        let camel = job_of(FULL_JOB).0;
        // Every key lowercased, as in Peloton's example/ files (enum names
        // are read in any case too).
        let mut lower = String::new();
        let mut word = String::new();
        for c in FULL_JOB.chars().chain(std::iter::once('\n')) {
            if c.is_ascii_alphabetic() {
                word.push(c);
                continue;
            }
            if c == ':' {
                word.make_ascii_lowercase();
            }
            lower.push_str(&word);
            word.clear();
            lower.push(c);
        }
        assert!(lower.contains("instancecount: 4"), "{lower}");
        assert!(lower.contains("defaultconfig:"), "{lower}");
        assert_eq!(job_of(&lower).0, camel);
        let shouting = "NAME: x\nINSTANCECOUNT: 1\nDefaultConfig: {Command: {VALUE: 'true'}, RESOURCE: {CPULIMIT: 1}}\n";
        let (file, _) = job_of(shouting);
        assert_eq!((file.name.as_str(), file.task.resources.cpu), ("x", 1.0));
    }

    #[test]
    fn a_disabled_health_check_is_no_health_check() {
        let (file, notes) = job_of(
            "name: h\ninstanceCount: 2\ndefaultConfig:\n  command: {value: 'true'}\n  \
             healthCheck: {enabled: true, commandCheck: {command: 'true'}}\n\
             instanceConfig:\n  1:\n    healthCheck: {enabled: false, type: HTTP, httpCheck: {port: 80}}\n",
        );
        assert!(notes.is_empty(), "{notes:?}");
        assert!(file.task.health_check.is_some());
        assert_eq!(file.overrides.len(), 1);
        assert_eq!(file.overrides[0].instance, 1);
        assert_eq!(file.overrides[0].task.health_check, None);
    }

    #[test]
    fn a_key_given_twice_in_two_cases_is_refused() {
        let err = job_error("name: x\ninstanceCount: 1\ninstancecount: 2\ndefaultConfig: {}\n");
        assert_eq!(
            err,
            "instancecount: given twice (keys are case-insensitive: `instanceCount` and `instancecount`)"
        );
    }

    #[test]
    fn instance_configs_merge_as_peloton_merges_them() {
        let (file, _) = job_of(
            r#"
name: m
instanceCount: 3
defaultConfig:
  resource: {cpuLimit: 1, memLimitMb: 64}
  ports: [{name: http}]
  killGracePeriodSeconds: 20
  restartPolicy: {maxFailures: 2}
  command: {value: 'echo default'}
instanceConfig:
  1:
    name: one
    command: {value: 'echo one'}
    killGracePeriodSeconds: 0
    ports: []
  "2":
    resource: {cpuLimit: 2, memLimitMb: 64}
    killGracePeriodSeconds: 5
"#,
        );
        assert_eq!(file.task.shell, "echo default");
        let instances: Vec<u32> = file.overrides.iter().map(|o| o.instance).collect();
        assert_eq!(instances, [1, 2]);
        let one = &file.overrides[0].task;
        // Its own command and no ports (given, if empty); the rest inherited,
        // a grace period of 0 too.
        assert_eq!(one.shell, "echo one");
        assert!(one.ports.is_empty());
        assert_eq!(one.resources.cpu, 1.0);
        assert_eq!(one.kill_grace_period_ms, 20_000);
        assert_eq!(one.restart.max_failures, 2);
        let two = &file.overrides[1].task;
        assert_eq!(two.shell, "echo default");
        assert_eq!(two.resources.cpu, 2.0);
        assert_eq!(two.ports, ["http"]);
        assert_eq!(two.kill_grace_period_ms, 5000);
    }

    #[test]
    fn what_is_per_job_here_must_not_differ_per_instance() {
        let base = "name: x\ninstanceCount: 2\ndefaultConfig:\n  command: {value: 'true'}\n  resource: {cpuLimit: 1}\n";
        // Booleans come from the instance config: left out, they are false.
        let err = job_error(&format!(
            "{base}  revocable: true\ninstanceConfig:\n  1: {{command: {{value: 'echo'}}}}\n"
        ));
        assert!(
            err.starts_with("instanceConfig.1.revocable: false here"),
            "{err}"
        );
        let err = job_error(&format!(
            "{base}instanceConfig:\n  1: {{revocable: true}}\n"
        ));
        assert!(
            err.starts_with("instanceConfig.1.revocable: true here"),
            "{err}"
        );
        let err = job_error(&format!(
            "{base}  labels: [{{key: a, value: b}}]\ninstanceConfig:\n  1: {{labels: [{{key: a, value: c}}]}}\n"
        ));
        assert!(
            err.starts_with("instanceConfig.1.labels: per-instance labels have no equivalent"),
            "{err}"
        );
        let err = job_error(&format!("{base}instanceConfig:\n  2: {{name: x}}\n"));
        assert_eq!(
            err,
            "instanceConfig.2: instance 2 is not below instanceCount 2"
        );
        let err = job_error(&format!("{base}instanceConfig:\n  one: {{name: x}}\n"));
        assert!(
            err.starts_with("instanceConfig.one: instance configs are keyed"),
            "{err}"
        );
    }

    #[test]
    fn fd_limits_are_noted_not_refused() {
        let (file, notes) = job_of(
            "name: x\ninstanceCount: 1\ndefaultConfig:\n  command: {value: 'true'}\n  \
             resource: {cpuLimit: 1, fdLimit: 10}\n",
        );
        assert_eq!(file.task.resources.cpu, 1.0);
        assert_eq!(
            notes_text(&notes),
            [
                "defaultConfig.resource.fdLimit: ignored, as Peloton ignores it (it never reaches \
              Mesos): every task gets its agent's open-file limit (RLIMIT_NOFILE, the agent's \
              --open-files, 65,536 by default)"
            ]
        );
    }

    #[test]
    fn only_instance_0_may_be_a_controller() {
        let job = |count: u32, default: &str, instances: &str| {
            format!(
                "name: x\ninstanceCount: {count}\ndefaultConfig:\n  command: {{value: 'true'}}\n{default}\
                 instanceConfig:\n{instances}"
            )
        };
        // Instance 0 of a larger batch job: its controller task, through
        // its override (made from the default config if it runs that).
        for text in [
            job(3, "", "  0: {controller: true}\n"),
            job(
                3,
                "  controller: true\n",
                "  1: {name: a}\n  2: {name: b}\n",
            ),
        ] {
            let (file, notes) = job_of(&text);
            assert!(notes.is_empty(), "{notes:?}");
            assert!(!file.task.controller, "{text}");
            let controllers: Vec<u32> = file
                .overrides
                .iter()
                .filter(|o| o.task.controller)
                .map(|o| o.instance)
                .collect();
            assert_eq!(controllers, [0], "{text}");
            assert_eq!(file.overrides[0].task.shell, "true", "{text}");
        }
        // A service's: an ordinary task, said in a note.
        let (file, notes) = job_of(&format!(
            "type: SERVICE\n{}",
            job(3, "", "  0: {controller: true}\n")
        ));
        assert!(file.overrides.iter().all(|o| !o.task.controller));
        let notes = notes_text(&notes);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains(".controller: instance 0 runs as an ordinary task"),
            "{notes:?}"
        );
        // A gang is one queue entry: no controller task in it.
        let err = job_error(&format!(
            "sla: {{minimumRunningInstances: 3}}\n{}",
            job(3, "", "  0: {controller: true}\n")
        ));
        assert_eq!(
            err,
            "instanceConfig.0.controller: a gang job (sla.minimumRunningInstances 3) cannot \
             have a controller task here: a gang is queued as one entry of one class"
        );
        // A job of one instance is a controller job.
        let (file, notes) = job_of(&job(1, "", "  0: {controller: true}\n"));
        assert!(notes.is_empty(), "{notes:?}");
        assert!(file.task.controller);
        assert!(file.overrides.iter().all(|o| o.task.controller));
        let err = job_error(&job(3, "", "  2: {controller: true}\n"));
        assert_eq!(
            err,
            "instanceConfig.2.controller: only instance 0 can be a controller task, as in Peloton"
        );
        let err = job_error(&job(3, "  controller: true\n", "  1: {name: a}\n"));
        assert_eq!(
            err,
            "defaultConfig.controller: only instance 0 can be a controller task, as in Peloton, \
             and instance 2 runs the default config"
        );
    }

    #[test]
    fn preemptibility_that_differs_per_instance_makes_the_job_non_preemptible() {
        // As in Peloton's test_preemptible_job_preemption_override.yaml.
        let (file, notes) = job_of(
            "name: x\ninstanceCount: 4\nsla: {preemptible: true}\ndefaultConfig:\n  \
             command: {value: 'true'}\n  preemptionPolicy: {killOnPreempt: true}\n\
             instanceConfig:\n  0: {preemptionPolicy: {type: 2}}\n  2: {preemptionPolicy: {type: 2}}\n",
        );
        assert!(!file.sla.preemptible);
        assert_eq!(
            notes_text(&notes),
            [
                "instanceConfig.0.preemptionPolicy.type: non-preemptible for instance 0, \
                 instance 2, and preemptibility is per job here: every instance of this job is \
                 non-preemptible (never preempted; admitted within the pool's reservation)",
                "defaultConfig.preemptionPolicy.killOnPreempt: no effect: this job is non-preemptible",
            ]
        );
        // The job's own sla.preemptible, where an instance says otherwise.
        let (file, notes) = job_of(
            "name: x\ninstanceCount: 2\nsla: {preemptible: false}\ndefaultConfig: {command: {value: 'true'}}\n\
             instanceConfig:\n  1: {preemptionPolicy: {type: TYPE_PREEMPTIBLE}}\n",
        );
        assert!(!file.sla.preemptible);
        assert!(
            notes_text(&notes)[0].starts_with(
                "sla.preemptible: non-preemptible for the instances without a config of their own,"
            ),
            "{notes:?}"
        );
        // Kill-on-preempt on a preemptible task: preempted, it runs again.
        let (file, notes) = job_of(
            "name: x\ninstanceCount: 2\nsla: {preemptible: true}\ndefaultConfig:\n  \
             command: {value: 'true'}\n  preemptionPolicy: {killOnPreempt: true}\n",
        );
        assert!(file.sla.preemptible);
        assert_eq!(
            notes_text(&notes),
            [
                "defaultConfig.preemptionPolicy.killOnPreempt: a preempted task runs again here once \
                 there is room (Peloton ends a preempted batch task as PREEMPTED)"
            ]
        );
        let err = job_error(
            "name: x\ntype: SERVICE\ninstanceCount: 1\ndefaultConfig:\n  command: {value: run}\n  \
             preemptionPolicy: {killOnPreempt: true}\n",
        );
        assert_eq!(
            err,
            "defaultConfig.preemptionPolicy.killOnPreempt: must be false but for a batch job, as in Peloton"
        );
    }

    #[test]
    fn a_default_config_that_no_instance_runs_is_not_checked() {
        // As in Peloton's example/testjob_with_health_check.yaml: every
        // instance has a health check of its own.
        let text = |count: u32| {
            format!(
                "name: x\ntype: SERVICE\ninstanceCount: {count}\ndefaultConfig:\n  command: {{value: run}}\n  \
                 healthCheck: {{type: 1, commandCheck: {{command: ''}}}}\ninstanceConfig:\n  \
                 0: {{healthCheck: {{commandCheck: {{command: check0}}}}}}\n  \
                 1: {{healthCheck: {{commandCheck: {{command: check1}}}}}}\n"
            )
        };
        let (file, _) = job_of(&text(2));
        let check = |task: &TaskFile| task.health_check.as_ref().and_then(|h| h.command.clone());
        // The job's task is instance 0's; instance 1 overrides it.
        assert_eq!(check(&file.task).as_deref(), Some("check0"));
        assert_eq!(file.task.shell, "run");
        assert_eq!(file.overrides.len(), 1);
        assert_eq!(file.overrides[0].instance, 1);
        assert_eq!(check(&file.overrides[0].task).as_deref(), Some("check1"));
        // Instance 2 runs the default config: checked.
        let err = job_error(&text(3));
        assert_eq!(
            err,
            "defaultConfig.healthCheck.commandCheck.command: missing: the command to run"
        );
    }

    #[test]
    fn aurora_update_requests_are_not_job_configs() {
        let text = "taskConfig:\n  job: {role: test, environment: dc, name: labrat}\n  isService: true\n\
                    instanceCount: 3\nsettings: {updateGroupSize: 1}\n";
        let want = "this is an Aurora job update request (taskConfig, instanceCount, settings)";
        for err in [
            job_error(text),
            job_format(&value(text)).unwrap_err().to_string(),
            kind(&value(text)).unwrap_err().to_string(),
        ] {
            assert!(err.starts_with(want), "{err}");
        }
    }

    #[test]
    fn the_default_config_may_set_preemptibility_for_the_job() {
        let (file, _) = job_of(
            "name: x\ninstanceCount: 2\nsla: {preemptible: false}\ndefaultConfig:\n  command: {value: 'true'}\n  \
             preemptionPolicy: {type: TYPE_PREEMPTIBLE}\ninstanceConfig:\n  1: {name: y}\n",
        );
        assert!(file.sla.preemptible);
    }

    #[test]
    fn fields_without_an_equivalent_are_refused_with_their_path() {
        let job = |task: &str| {
            format!(
                "name: x\ninstanceCount: 1\ndefaultConfig:\n  command: {{value: 'true'}}\n{task}"
            )
        };
        for (extra, want) in [
            (
                "  container: {type: 1, docker: {image: debian}}\n",
                "defaultConfig.container: container images (Docker or Mesos) are not supported",
            ),
            (
                "  executor: {type: 1}\n",
                "defaultConfig.executor: custom Mesos executors are not supported",
            ),
            (
                "  ports: [{name: http, value: 8080}]\n",
                "defaultConfig.ports[0].value: static ports are not supported",
            ),
            (
                "  healthCheck: {type: HTTP, httpCheck: {port: 80}}\n",
                "defaultConfig.healthCheck.httpCheck: HTTP checks name a fixed port number",
            ),
            (
                "  healthCheck: {type: 2}\n",
                "defaultConfig.healthCheck.type: HTTP checks name a fixed port number",
            ),
            (
                "  healthCheck: {type: GRPC}\n",
                "defaultConfig.healthCheck.type: gRPC health checks are not supported",
            ),
            (
                "  healthCheck: {type: 1, commandCheck: {command: 'true', unshareEnvironments: true}}\n",
                "defaultConfig.healthCheck.commandCheck.unshareEnvironments: a health check runs with the task's environment",
            ),
            (
                "  healthCheck: {intervalSecs: 1}\n",
                "defaultConfig.healthCheck.commandCheck: missing",
            ),
            (
                "  healthCheck: {enabled: false, port: 80}\n",
                "defaultConfig.healthCheck.port: unknown field of Peloton's HealthCheckConfig",
            ),
            (
                "  resource: {cpuLimit: 1, fdLimit: -1}\n",
                "defaultConfig.resource.fdLimit: must not be negative (got -1)",
            ),
            (
                "  volume: {containerPath: data, sizeMB: 10, extra: 1}\n",
                "defaultConfig.volume.extra: unknown field of Peloton's PersistentVolumeConfig",
            ),
            (
                "  resources: {cpuLimit: 1}\n",
                "defaultConfig.resources: unknown field of Peloton's task config (TaskConfig)",
            ),
            (
                "  resource: {cpuLimit: -1}\n",
                "defaultConfig.resource.cpuLimit: must not be negative (got -1)",
            ),
        ] {
            let err = job_error(&job(extra));
            assert!(err.starts_with(want), "{extra}: {err}");
        }
        let with_command = |command: &str| {
            format!("name: x\ninstanceCount: 1\ndefaultConfig:\n  command: {command}\n")
        };
        for (command, want) in [
            (
                "{value: 'true', uris: [{value: 'http://x/y'}]}",
                "defaultConfig.command.uris: fetching URIs into the sandbox is not supported",
            ),
            (
                "{value: 'true', user: nobody}",
                "defaultConfig.command.user: running a task as another user is not supported",
            ),
            (
                "{value: 'true', arguments: [a]}",
                "defaultConfig.command.arguments[0]: Mesos ignores arguments when shell is true",
            ),
            (
                "{value: 'true', environment: {variables: [{name: S, type: SECRET, secret: {}}]}}",
                "defaultConfig.command.environment.variables[0].type: secret variables are not supported here",
            ),
            ("{shell: true}", "defaultConfig.command.value: missing"),
        ] {
            let err = job_error(&with_command(command));
            assert!(err.starts_with(want), "{command}: {err}");
        }
        for (text, want) in [
            (
                "name: x\ninstanceCount: 1\ndefaultSpec: {containers: []}\n",
                "defaultSpec: Peloton's v1alpha job specs are not supported",
            ),
            (
                "name: x\ninstanceCount: 1\ndefaultConfig: {command: {value: 'true'}}\nsla: {priorty: 1}\n",
                "sla.priorty: unknown field of Peloton's SlaConfig",
            ),
            (
                "name: x\ninstanceCount: 1\ndefaultConfig: {command: {value: 'true'}}\nrespoolID: {value: 5a3d-1}\n",
                "respoolID.value: \"5a3d-1\" is not a pool path",
            ),
            (
                "name: x\ninstanceCount: 1\ndefaultConfig: {}\n",
                "defaultConfig.command: missing",
            ),
            (
                "name: x\ndefaultConfig: {command: {value: 'true'}}\n",
                "instanceCount: missing",
            ),
            ("name: x\ninstanceCount: 1\n", "defaultConfig: missing"),
            (
                "name: x\ninstanceCount: 1\ntype: CRON\ndefaultConfig: {command: {value: 'true'}}\n",
                "type: unknown value CRON; one of BATCH (0), SERVICE (1), DAEMON (2)",
            ),
            (
                "name: x\ninstanceCount: -1\ndefaultConfig: {command: {value: 'true'}}\n",
                "instanceCount: must not be negative",
            ),
            (
                "name: x\ninstanceCount: 1\nlabels: [{key: a, value: b}, {key: a, value: c}]\ndefaultConfig: {command: {value: 'true'}}\n",
                "labels[1].key: label \"a\" is given twice",
            ),
        ] {
            let err = job_error(text);
            assert!(err.starts_with(want), "{text}: {err}");
        }
    }

    #[test]
    fn informational_fields_are_kept_or_noted() {
        let (file, notes) = job_of(
            "changelog: null\nname: x\nowningteam: t\nldapgroups: [a, b]\ndescription: d\ninstancecount: 1\n\
             sla: {minimumInstanceCount: 1, minimumInstancePercent: 50}\n\
             defaultconfig: {name: n, command: {value: 'true'}, resource: {cpulimit: 1}}\n",
        );
        assert_eq!(
            file.labels.get(OWNING_TEAM_LABEL).map(String::as_str),
            Some("t")
        );
        assert_eq!(
            file.labels.get(LDAP_GROUPS_LABEL).map(String::as_str),
            Some("a,b")
        );
        assert_eq!(
            file.labels.get(DESCRIPTION_LABEL).map(String::as_str),
            Some("d")
        );
        let notes = notes_text(&notes);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(
            notes[0].starts_with("sla.minimumInstanceCount: ignored"),
            "{notes:?}"
        );
        assert!(
            notes[1].starts_with("sla.minimumInstancePercent: ignored"),
            "{notes:?}"
        );
        // A null changelog is nothing to note; a label clashing with one of
        // these is refused.
        let err = job_error(
            "name: x\ndescription: d\nlabels: [{key: peloton.description, value: e}]\ninstanceCount: 1\n\
             defaultConfig: {command: {value: 'true'}}\n",
        );
        assert!(
            err.starts_with("labels[0]: label \"peloton.description\" is already \"d\""),
            "{err}"
        );
    }

    #[test]
    fn commands_keep_mesos_meaning() {
        let job = |command: &str, ports: &str| {
            format!(
                "name: x\ninstanceCount: 1\ndefaultConfig:\n  resource: {{cpuLimit: 1}}\n  ports: {ports}\n  command: {command}\n"
            )
        };
        // shell defaults to true, as in Mesos.
        let (file, _) = job_of(&job("{value: 'echo $A'}", "[]"));
        assert_eq!(file.task.shell, "echo $A");
        // shell false: arguments[0] is argv[0].
        let (file, notes) = job_of(&job(
            "{shell: false, value: /bin/echo, arguments: [echo, a b, c]}",
            "[]",
        ));
        assert_eq!(
            (file.task.command.as_str(), file.task.shell.as_str()),
            ("/bin/echo", "")
        );
        assert_eq!(file.task.args, ["a b", "c"]);
        assert_eq!(
            notes_text(&notes),
            [
                "defaultConfig.command.arguments[0]: argv[0] in Mesos, not passed: here the program's argv[0] is its own name"
            ]
        );
        let (_, notes) = job_of(&job(
            "{shell: false, value: echo, arguments: [echo, a]}",
            "[]",
        ));
        assert!(notes.is_empty(), "argv[0] equal to the program: {notes:?}");
        // A port's own variable name is exported from ours, for the task and
        // its check; a program then runs under exec with quoted words.
        let ports =
            "[{name: http, envName: HTTP_PORT}, {name: admin, envName: PELOTON_PORT_ADMIN}]";
        let (file, _) = job_of(&job("{value: 'serve $HTTP_PORT'}", ports));
        assert_eq!(
            file.task.shell,
            "export HTTP_PORT=\"$PELOTON_PORT_HTTP\"; serve $HTTP_PORT"
        );
        assert_eq!(file.task.ports, ["http", "admin"]);
        let (file, _) = job_of(&job(
            "{shell: false, value: /bin/serve, arguments: [serve, --port, \"it's\"]}",
            ports,
        ));
        assert_eq!(
            file.task.shell,
            "export HTTP_PORT=\"$PELOTON_PORT_HTTP\"; exec /bin/serve --port 'it'\\''s'"
        );
        assert_eq!(file.task.command, "");
        let err = job_error(&job("{value: x}", "[{name: http, envName: 'A B'}]"));
        assert_eq!(
            err,
            "defaultConfig.ports[0].envName: \"A B\" is not an environment variable name"
        );
    }

    #[test]
    fn health_checks_take_mesos_defaults_and_the_port_variables() {
        let (file, _) = job_of(
            "name: x\ninstanceCount: 1\ntype: 1\ndefaultConfig:\n  ports: [{name: http, envName: P}]\n  \
             command: {value: run}\n  healthCheck: {commandCheck: {command: 'check $P'}}\n",
        );
        assert_eq!(
            file.task.health_check,
            Some(HealthCheckFile {
                command: Some("export P=\"$PELOTON_PORT_HTTP\"; check $P".into()),
                initial_delay_ms: 15_000,
                interval_ms: 10_000,
                timeout_ms: 20_000,
                max_consecutive_failures: 3,
                ..Default::default()
            })
        );
    }

    fn constraint_of(constraint: &str) -> std::result::Result<(String, u32), String> {
        let text = format!(
            "name: x\ninstanceCount: 1\ndefaultConfig:\n  labels: [{{key: app, value: web}}]\n  \
             command: {{value: 'true'}}\n  constraint: {constraint}\n"
        );
        job(&value(&text))
            .map(|(f, _)| (f.task.constraint, f.task.max_instances_per_host))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn constraints_become_expressions_and_per_host_limits() {
        let host = |condition: &str, requirement: u32| {
            format!(
                "{{type: 1, labelConstraint: {{kind: 2, condition: {condition}, requirement: {requirement}, label: {{key: hostname, value: h1}}}}}}"
            )
        };
        assert_eq!(constraint_of(&host("2", 1)), Ok(("host == h1".into(), 0)));
        assert_eq!(
            constraint_of(&host("CONDITION_EQUAL", 0)),
            Ok(("host != h1".into(), 0))
        );
        assert_eq!(
            constraint_of(&host("CONDITION_LESS_THAN", 1)),
            Ok(("host != h1".into(), 0))
        );
        assert_eq!(
            constraint_of(&host("CONDITION_GREATER_THAN", 0)),
            Ok(("host == h1".into(), 0))
        );
        assert_eq!(
            constraint_of(&host("CONDITION_LESS_THAN", 5)),
            Ok((String::new(), 0))
        );
        let err = constraint_of(&host("CONDITION_GREATER_THAN", 1)).unwrap_err();
        assert!(
            err.starts_with(
                "defaultConfig.constraint.labelConstraint.requirement: 1: can never hold"
            ),
            "{err}"
        );
        let task = |condition: &str, requirement: u32, value: &str| {
            format!(
                "{{labelConstraint: {{kind: TASK, condition: {condition}, requirement: {requirement}, label: {{key: app, value: {value}}}}}}}"
            )
        };
        assert_eq!(
            constraint_of(&task("CONDITION_EQUAL", 0, "web")),
            Ok((String::new(), 1))
        );
        assert_eq!(
            constraint_of(&task("CONDITION_LESS_THAN", 3, "web")),
            Ok((String::new(), 3))
        );
        let err = constraint_of(&task("CONDITION_EQUAL", 0, "db")).unwrap_err();
        assert!(
            err.contains("app=db is not one of this task's labels"),
            "{err}"
        );
        let err = constraint_of(&task("CONDITION_GREATER_THAN", 0, "web")).unwrap_err();
        assert!(err.contains("only CONDITION_EQUAL 0"), "{err}");
        // AND keeps both kinds; OR takes host expressions only.
        let zone = "{type: 1, labelConstraint: {kind: 2, condition: 2, requirement: 1, label: {key: zone, value: \"z 1\"}}}";
        let and = format!(
            "{{type: AND_CONSTRAINT, andConstraint: {{constraints: [{}, {zone}, {}]}}}}",
            host("2", 0),
            task("CONDITION_EQUAL", 0, "web")
        );
        assert_eq!(
            constraint_of(&and),
            Ok(("(host != h1) and (zone == \"z 1\")".into(), 1))
        );
        let or = format!(
            "{{type: 3, orConstraint: {{constraints: [{}, {zone}]}}}}",
            host("2", 1)
        );
        assert_eq!(
            constraint_of(&or),
            Ok(("(host == h1) or (zone == \"z 1\")".into(), 0))
        );
        let or = format!(
            "{{orConstraint: {{constraints: [{}, {zone}]}}}}",
            task("2", 0, "web")
        );
        let err = constraint_of(&or).unwrap_err();
        assert!(
            err.contains("only at the top, or in a top-level AND"),
            "{err}"
        );
        let err = constraint_of("{type: 1, labelConstraint: {kind: 2, condition: 2, requirement: 1, label: {key: a, value: 'x\"y'}}}").unwrap_err();
        assert!(
            err.contains("constraints cannot match a double quote"),
            "{err}"
        );
    }

    #[test]
    fn types_volumes_pools_and_placement() {
        let base = "name: x\ninstanceCount: 1\ndefaultConfig: {command: {value: 'true'}}\n";
        for (t, want) in [
            ("BATCH", JobTypeName::Batch),
            ("0", JobTypeName::Batch),
            ("service", JobTypeName::Service),
            ("1", JobTypeName::Service),
            ("DAEMON", JobTypeName::Daemon),
            ("2", JobTypeName::Daemon),
        ] {
            assert_eq!(
                job_of(&format!("type: {t}\n{base}")).0.job_type,
                want,
                "{t}"
            );
        }
        // A service whose tasks have volumes is a stateful job here.
        let (file, _) = job_of(
            "name: x\ntype: 1\ninstanceCount: 1\ndefaultConfig:\n  command: {value: 'true'}\n  volume: {containerPath: data, sizeMB: 20}\n",
        );
        assert_eq!(file.job_type, JobTypeName::Stateful);
        assert_eq!(
            file.task.volume,
            Some(VolumeFile {
                size_mb: 20,
                path: "data".into()
            })
        );
        assert_eq!(
            job_of(&format!("respoolID: {{value: root}}\n{base}"))
                .0
                .pool,
            "/"
        );
        assert_eq!(job_of(&format!("respoolid: /a/b/\n{base}")).0.pool, "/a/b");
        assert_eq!(
            job_of(&format!("placementStrategy: 1\n{base}")).0.placement,
            PlacementName::Pack
        );
        assert_eq!(job_of(base).0.placement, PlacementName::Pack);
        // sla.revocable makes every task revocable.
        let (file, _) = job_of(&format!("sla: {{revocable: true}}\n{base}"));
        assert!(file.task.revocable);
        // A daemon needs no instance count, and has no instance configs.
        let (file, _) =
            job_of("name: d\ntype: DAEMON\ndefaultConfig: {command: {value: 'true'}}\n");
        assert_eq!(file.instances, 0);
    }

    const FULL_POOL: &str = r#"
changelog: null
name: pool
owningteam: team6
ldapgroups: [a]
description: d
resources:
- {kind: cpu, reservation: 4, limit: 8, share: 3, type: STATIC}
- {kind: memory, reservation: 2048, limit: 4096, share: 1, type: 2}
- {kind: disk, reservation: 10, limit: 20, type: STATIC}
- {kind: gpu, reservation: 0, limit: 0, share: 1, type: STATIC}
parent: {value: /prod}
policy: PriorityFIFO
controllerlimit: {maxpercent: 10}
slacklimit: {maxpercent: 30}
"#;

    #[test]
    fn every_pool_field_maps() {
        let (file, notes) = pool_of(FULL_POOL, None);
        assert_eq!(
            file,
            PoolFile {
                path: "/prod/pool".into(),
                reservation: ResourcesFile {
                    cpu: 4.0,
                    memory_mb: 2048.0,
                    disk_mb: 10.0,
                    gpu: 0.0
                },
                limit: ResourcesFile {
                    cpu: 8.0,
                    memory_mb: 4096.0,
                    disk_mb: 20.0,
                    gpu: 0.001
                },
                share: 0.0,
                shares: Some(ResourcesFile {
                    cpu: 3.0,
                    memory_mb: 1.0,
                    disk_mb: 1.0,
                    gpu: 1.0
                }),
                kind: PoolKindName::Static,
                controller_limit_pct: 10.0,
                slack_limit_pct: 30.0,
                strict_order: false,
            }
        );
        assert_eq!(
            notes_text(&notes),
            [
                "owningteam: ignored: pools have no labels here",
                "ldapgroups: ignored: pools have no labels here",
                "description: ignored: pools have no labels here",
                "resources[3].limit: gpu: Peloton's limit 0 (none) is written as the smallest \
                 limit, 0.001 (0 means no limit here)",
            ]
        );
        // The same in camelCase, named by a path on the command line.
        let camel = FULL_POOL
            .replace("owningteam", "owningTeam")
            .replace(
                "controllerlimit: {maxpercent",
                "controllerLimit: {maxPercent",
            )
            .replace("parent: {value: /prod}", "");
        assert_eq!(pool_of(&camel, Some("/prod/pool")).0, file);
    }

    #[test]
    fn pool_defaults_follow_peloton() {
        // Kinds not listed get Peloton's limit 0 (none); equal shares are
        // one share; no parent is the root.
        let (file, notes) = pool_of(
            "name: p\nresources:\n- {kind: cpu, reservation: 1, limit: 2, share: 2}\n- {kind: memory, reservation: 1, limit: 2, share: 2}\n\
             - {kind: disk, limit: 1, share: 2}\n- {kind: gpu, limit: 1, share: 2}\ncontrollerLimit: {maxPercent: 0}\n",
            None,
        );
        assert_eq!(file.path, "/p");
        assert_eq!((file.share, file.shares), (2.0, None));
        assert_eq!(file.controller_limit_pct, 0.001);
        assert_eq!(file.slack_limit_pct, 0.0);
        assert_eq!(notes.len(), 1, "{notes:?}");
        let (file, notes) = pool_of("name: p\nresources: [{kind: cpu, limit: 2}]\n", None);
        assert_eq!(
            file.limit,
            ResourcesFile {
                cpu: 2.0,
                memory_mb: 1.0,
                disk_mb: 1.0,
                gpu: 0.001
            }
        );
        assert_eq!(
            (file.share, file.shares),
            (0.0, None),
            "a missing share is 1"
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(
            notes[0]
                .to_string()
                .starts_with("resources: no memory entry"),
            "{notes:?}"
        );
        assert_eq!(
            pool_of("name: p\nparent: {value: root}\n", None).0.path,
            "/p"
        );
    }

    #[test]
    fn bad_pool_configs_are_refused_with_their_path() {
        for (text, path, want) in [
            (
                "name: p\nresources: [{kind: tpu}]\n",
                None,
                "resources[0].kind: unknown kind \"tpu\"",
            ),
            (
                "name: p\nresources: [{kind: cpu}, {kind: CPU}]\n",
                None,
                "resources[1].kind: CPU is given twice",
            ),
            (
                "name: p\nresources: [{kind: cpu, reservation: 3, limit: 2}]\n",
                None,
                "resources[0]: reservation 3 exceeds limit 2",
            ),
            (
                "name: p\nresources: [{kind: cpu, share: -1}]\n",
                None,
                "resources[0].share: must not be negative (got -1)",
            ),
            (
                "name: p\nresources: [{kind: cpu, type: STATIC}, {kind: memory, type: ELASTIC}]\n",
                None,
                "resources[1].type: every kind of a pool has the same reservation type",
            ),
            (
                "name: p\npolicy: LIFO\n",
                None,
                "policy: unknown value LIFO; one of UNKNOWN (0), PriorityFIFO (1)",
            ),
            (
                "name: p\nslackLimit: {maxPercent: 120}\n",
                None,
                "slackLimit.maxPercent: must be 0–100 (got 120)",
            ),
            (
                "name: p\nreservations: []\n",
                None,
                "reservations: unknown field of Peloton's resource pool config",
            ),
            ("resources: []\n", None, "name: missing"),
            (
                "name: p\n",
                Some("/a/q"),
                "name: \"p\" does not match the pool path /a/q",
            ),
            (
                "name: p\nparent: {value: /b}\n",
                Some("/a/p"),
                "parent.value: /b is not the parent of the pool path /a/p",
            ),
            (
                "name: p\nparent: {value: abc}\n",
                None,
                "parent.value: \"abc\" is not a pool path",
            ),
        ] {
            let err = pool_error(text, path);
            assert!(err.starts_with(want), "{text}: {err}");
        }
    }

    #[test]
    fn formats_are_told_apart_by_their_keys() {
        let format = |text: &str| job_format(&value(text)).map_err(|e| e.to_string());
        assert_eq!(format("name: x\ntask: {}\n"), Ok(Format::Native));
        assert_eq!(format("name: x\ninstanceCount: 1\n"), Ok(Format::Peloton));
        assert_eq!(format("name: x\nDEFAULTCONFIG: {}\n"), Ok(Format::Peloton));
        assert_eq!(
            format("name: x\nlabels: [{key: a, value: b}]\n"),
            Ok(Format::Peloton)
        );
        assert_eq!(format("name: x\n"), Ok(Format::Native));
        let err = format("name: x\ntask: {}\ninstanceCount: 1\n").unwrap_err();
        assert_eq!(
            err,
            "mixes the native format's `task` with Peloton's `instanceCount`; write one format or the other"
        );
        let format = |text: &str| pool_format(&value(text)).map_err(|e| e.to_string());
        assert_eq!(format("path: /a\n"), Ok(Format::Native));
        assert_eq!(format("pools: []\n"), Ok(Format::Native));
        assert_eq!(format("name: a\nresources: []\n"), Ok(Format::Peloton));
        assert!(format("path: /a\nresources: []\n").is_err());
        let kind_of = |text: &str| kind(&value(text)).map_err(|e| e.to_string());
        assert_eq!(kind_of("name: a\ninstanceCount: 1\n"), Ok(Kind::Job));
        assert_eq!(kind_of("name: a\nresources: []\n"), Ok(Kind::Pool));
        assert!(
            kind_of("name: a\ntask: {}\n")
                .unwrap_err()
                .starts_with("not in Peloton's format")
        );
        assert!(
            kind_of("name: a\n")
                .unwrap_err()
                .starts_with("cannot tell a job")
        );
        assert!(
            kind_of("name: a\nsla: {}\nresources: []\n")
                .unwrap_err()
                .contains("one or the other")
        );
    }
}
