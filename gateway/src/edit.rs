//! An update of a batch job as an edit: the new spec may differ from the
//! job's only in the fields an edit changes (`JobService.Edit`); anything
//! else is refused naming the first field that differs. Both specs are read
//! the same way (`reads::job_spec` of a validated plan), so defaults the
//! server fills in never count as changes.

use peloton_proto::v1 as pb;

use crate::lifecycle::{Error, JobEdit};

/// The edit that turns `current` into `new`, or the first field outside an
/// edit's reach that differs. An edit with nothing in it is refused too.
pub(crate) fn batch_edit(current: &pb::JobSpec, new: &pb::JobSpec) -> Result<JobEdit, Error> {
    let sla_of = |s: &pb::JobSpec| s.sla.unwrap_or_default();
    let (old_sla, new_sla) = (sla_of(current), sla_of(new));
    let failures = |t: &Option<pb::TaskSpec>| {
        t.as_ref()
            .and_then(|t| t.restart.as_ref())
            .map_or(0, |r| r.max_failures)
    };
    let new_failures = failures(&new.default_task);
    for o in &new.overrides {
        if failures(&o.spec) != new_failures {
            return Err(Error::invalid(
                &format!("spec.overrides[{}].spec.restart.max_failures", o.instance),
                "an edit sets one max_failures for the default task and every override",
            ));
        }
    }
    // The current spec with the new values of the editable fields: what
    // `new` must equal.
    let mut expected = current.clone();
    let sla = expected.sla.get_or_insert_with(Default::default);
    sla.priority = new_sla.priority;
    sla.max_running_instances = new_sla.max_running_instances;
    sla.max_running_time_ms = new_sla.max_running_time_ms;
    let set_failures = |t: &mut Option<pb::TaskSpec>| {
        if let Some(t) = t {
            t.restart.get_or_insert_with(Default::default).max_failures = new_failures;
        }
    };
    set_failures(&mut expected.default_task);
    for o in &mut expected.overrides {
        set_failures(&mut o.spec);
    }
    let mut new = new.clone();
    // Absent and default messages read alike.
    normalise(&mut expected);
    normalise(&mut new);
    if let Some(field) = first_difference(&expected, &new) {
        return Err(Error::invalid(
            &field,
            "a batch job's update may change only sla.priority, sla.max_running_instances, \
             sla.max_running_time_ms and restart.max_failures (kill it and create it again \
             to change the rest)",
        ));
    }
    let changed = |a: u64, b: u64| (a != b).then_some(b);
    let edit = JobEdit {
        priority: changed(old_sla.priority.into(), new_sla.priority.into()).map(|v| v as u32),
        max_running: changed(
            old_sla.max_running_instances.into(),
            new_sla.max_running_instances.into(),
        )
        .map(|v| v as u32),
        max_running_time_ms: changed(old_sla.max_running_time_ms, new_sla.max_running_time_ms),
        max_failures: changed(failures(&current.default_task).into(), new_failures.into())
            .map(|v| v as u32),
    };
    Ok(edit)
}

fn normalise(spec: &mut pb::JobSpec) {
    if spec.sla == Some(pb::Sla::default()) {
        spec.sla = None;
    }
    let tidy = |t: &mut Option<pb::TaskSpec>| {
        if let Some(t) = t
            && t.restart == Some(pb::RestartPolicy::default())
        {
            t.restart = None;
        }
    };
    tidy(&mut spec.default_task);
    for o in &mut spec.overrides {
        tidy(&mut o.spec);
    }
    // Secrets go their own way (an update's set replaces the job's).
    spec.secrets.clear();
}

/// The API path of the first field in which `a` and `b` differ.
fn first_difference(a: &pb::JobSpec, b: &pb::JobSpec) -> Option<String> {
    macro_rules! fields {
        ($x:expr, $y:expr, $prefix:literal, [$($f:ident),* $(,)?]) => {
            $(
                if $x.$f != $y.$f {
                    return Some(concat!($prefix, stringify!($f)).replace("r#", ""));
                }
            )*
        };
    }
    fields!(
        a,
        b,
        "spec.",
        [name, owner, labels, r#type, pool, instance_count]
    );
    match (&a.default_task, &b.default_task) {
        (Some(x), Some(y)) if x != y => {
            fields!(
                x,
                y,
                "spec.default_task.",
                [
                    command, args, shell, env, resources, ports, constraint, restart
                ]
            );
            return Some("spec.default_task".into());
        }
        (x, y) if x != y => return Some("spec.default_task".into()),
        _ => {}
    }
    if a.overrides != b.overrides {
        return Some("spec.overrides".into());
    }
    let (x, y) = (a.sla.unwrap_or_default(), b.sla.unwrap_or_default());
    fields!(
        x,
        y,
        "spec.sla.",
        [
            preemptible,
            min_running_instances,
            max_unavailable_instances
        ]
    );
    fields!(
        a,
        b,
        "spec.",
        [
            placement,
            host_pool,
            stateful,
            application,
            rendezvous,
            after
        ]
    );
    (a != b).then(|| "spec".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> pb::JobSpec {
        pb::JobSpec {
            name: "j".into(),
            pool: "/p".into(),
            instance_count: 3,
            default_task: Some(pb::TaskSpec {
                command: "true".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn editable_fields_make_an_edit_of_what_changed() {
        let mut new = spec();
        new.sla = Some(pb::Sla {
            priority: 4,
            max_running_time_ms: 1000,
            ..Default::default()
        });
        new.default_task.as_mut().unwrap().restart = Some(pb::RestartPolicy {
            max_failures: 2,
            ..Default::default()
        });
        let edit = batch_edit(&spec(), &new).expect("editable");
        assert_eq!(
            edit,
            JobEdit {
                priority: Some(4),
                max_running: None,
                max_running_time_ms: Some(1000),
                max_failures: Some(2),
            }
        );
        assert!(batch_edit(&spec(), &spec()).expect("same").is_empty());
    }

    #[test]
    fn other_changes_are_refused_naming_the_field() {
        type Change = fn(&mut pb::JobSpec);
        let cases: [(&str, Change); 5] = [
            ("spec.instance_count", |s| s.instance_count = 4),
            ("spec.default_task.command", |s| {
                s.default_task.as_mut().unwrap().command = "false".into();
            }),
            ("spec.sla.preemptible", |s| {
                s.sla.get_or_insert_with(Default::default).preemptible = true;
            }),
            ("spec.labels", |s| {
                s.labels.insert("a".into(), "b".into());
            }),
            ("spec.type", |s| s.r#type = pb::JobType::Service as i32),
        ];
        for (field, change) in cases {
            let mut new = spec();
            new.sla = Some(pb::Sla {
                priority: 9,
                ..Default::default()
            });
            change(&mut new);
            match batch_edit(&spec(), &new) {
                Err(Error::Invalid { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
