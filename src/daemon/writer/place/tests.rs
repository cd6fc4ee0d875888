//! Tests of output placement: atomic, suffixed and idempotent writes, hostile names kept inside
//! `outputs/`, stale temporaries removed (and nothing else), `write_new` never replacing, and a
//! staged group plan invisible until linked.

use super::*;
use crate::daemon::writer::render;
use crate::daemon::writer::tests::{failed, ok};
use crate::error::ErrorClass;
use time::macros::date;

#[test]
fn placing_is_atomic_suffixed_and_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = OutputDir::new(dir.path().join("outputs"));
    let today = date!(2026 - 03 - 04);
    let files = render(InputKind::Txt, "my q ü.txt", &[ok("t1", None, None, "A")]);
    let p = out
        .place("my q ü.txt", InputKind::Txt, &files, today, &[])
        .expect("place");
    let day = dir.path().join("outputs/2026-03-04");
    assert_eq!(
        p.files,
        vec![day.join("my q ü.md"), day.join("my q ü.json")]
    );
    assert_eq!(
        p.task_paths,
        vec![("t1".to_string(), day.join("my q ü.md"))]
    );
    assert!(!p.reused);
    assert_eq!(std::fs::read(day.join("my q ü.md")).unwrap(), b"A\n");

    // The same rows again, with the base the ledger recorded: nothing new.
    let base = group_base(InputKind::Txt, &p.task_paths[0].1).expect("base");
    assert_eq!(base, day.join("my q ü"));
    let again = out
        .place(
            "my q ü.txt",
            InputKind::Txt,
            &files,
            today,
            std::slice::from_ref(&base),
        )
        .expect("place");
    assert!(again.reused);
    assert_eq!(again.files, p.files);

    // A different task with the same stem gets a suffix; an error file also takes the stem.
    let other = render(InputKind::Txt, "my q ü.txt", &[ok("t2", None, None, "B")]);
    let p2 = out
        .place(
            "my q ü.txt",
            InputKind::Txt,
            &other,
            today,
            std::slice::from_ref(&base),
        )
        .expect("place");
    assert_eq!(p2.files[0], day.join("my q ü-1.md"));
    let err = render(
        InputKind::Txt,
        "my q ü.txt",
        &[failed("t3", None, None, "failed", ErrorClass::InvalidInput)],
    );
    let p3 = out
        .place("my q ü.txt", InputKind::Txt, &err, today, &[])
        .expect("place");
    assert_eq!(p3.files[0], day.join("my q ü-2.error.json"));
    assert_eq!(
        std::fs::read(day.join("my q ü.md")).unwrap(),
        b"A\n",
        "never overwritten"
    );

    // A recorded identical group is found whatever its day folder (a month later here).
    let later = date!(2026 - 04 - 04);
    let p4 = out
        .place(
            "my q ü.txt",
            InputKind::Txt,
            &files,
            later,
            std::slice::from_ref(&base),
        )
        .unwrap();
    assert!(p4.reused);
    assert_eq!(p4.files, p.files);

    // No temporaries are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&day)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn hostile_names_stay_inside_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = OutputDir::new(dir.path().join("outputs"));
    let files = render(
        InputKind::Txt,
        "../../escape.txt",
        &[ok("t1", None, None, "x")],
    );
    let p = out
        .place(
            "../../escape.txt",
            InputKind::Txt,
            &files,
            date!(2026 - 01 - 01),
            &[],
        )
        .expect("place");
    for f in &p.files {
        assert!(
            f.starts_with(dir.path().join("outputs/2026-01-01")),
            "{}",
            f.display()
        );
    }
    assert!(out.check_inside(&dir.path().join("outputs/../x")).is_err());
    assert!(out
        .check_inside(&dir.path().join("elsewhere/2026-01-01/x"))
        .is_err());
}

#[test]
fn stale_temporaries_are_removed_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = OutputDir::new(dir.path());
    let day = dir.path().join("2026-01-01");
    std::fs::create_dir_all(&day).unwrap();
    let stale = format!(".a.md.{}.tmp", uuid::Uuid::now_v7().simple());
    for name in [stale.as_str(), "a.md", ".a.md.tmp", "b.tmp", ".x.zzzz.tmp"] {
        std::fs::write(day.join(name), "x").unwrap();
    }
    assert_eq!(out.remove_stale_temporaries(), 1);
    assert!(!day.join(&stale).exists());
    assert_eq!(std::fs::read_dir(&day).unwrap().count(), 4);
}

#[test]
fn write_new_never_replaces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("a.md");
    assert!(write_new(&p, b"one").unwrap());
    assert!(!write_new(&p, b"two").unwrap());
    assert_eq!(std::fs::read(&p).unwrap(), b"one");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_staged_plan_is_invisible_until_linked_and_linking_is_idempotent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = OutputDir::new(dir.path().join("outputs"));
    let today = date!(2026 - 03 - 04);
    let day = dir.path().join("outputs/2026-03-04");
    let files = render(InputKind::Txt, "q.txt", &[ok("t1", None, None, "A")]);
    let Staged::New(plan) = out
        .stage("q.txt", InputKind::Txt, &files, today, &[])
        .unwrap()
    else {
        panic!("nothing recorded: must stage")
    };
    let visible = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        v.sort();
        v
    };
    assert!(visible(&day).is_empty(), "staged files are hidden");
    // A crash after linking the first file only: linking the same plan again completes it.
    link_staged(&plan.files[0]).unwrap();
    assert_eq!(visible(&day), vec!["q.md"]);
    let placed = out.link_plan(&plan).unwrap();
    assert_eq!(placed.files, vec![day.join("q.md"), day.join("q.json")]);
    assert_eq!(visible(&day), vec!["q.json", "q.md"]);
    out.discard_temporaries(&plan);
    assert_eq!(
        std::fs::read_dir(&day).unwrap().count(),
        2,
        "no temporaries"
    );

    // Rolling back removes only the plan's own links, never another file.
    let other = render(InputKind::Txt, "q.txt", &[ok("t2", None, None, "B")]);
    let Staged::New(plan2) = out
        .stage("q.txt", InputKind::Txt, &other, today, &[])
        .unwrap()
    else {
        panic!("different bytes: must stage")
    };
    assert_eq!(plan2.files[0].path, day.join("q-1.md"));
    link_staged(&plan2.files[0]).unwrap();
    std::fs::write(day.join("q-1.json"), "someone else's").unwrap();
    assert!(out.link_plan(&plan2).is_err(), "never replaces a file");
    out.roll_back(&plan2);
    assert_eq!(visible(&day), vec!["q-1.json", "q.json", "q.md"]);
    assert_eq!(
        std::fs::read(day.join("q-1.json")).unwrap(),
        b"someone else's"
    );
}
