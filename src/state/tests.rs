//! The contract of [`StateStore`], checked for every store.

use std::sync::Arc;

use datafusion::arrow::array::{
    AsArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, TimeUnit};

use super::{StateLayout, StoreKind, open};

/// State rows `(start, end, k, n)`: a window, a group key and a value.
/// `grouped`: whether the operator looks rows up by group (the RocksDB store then keeps
/// them ordered by key, with a time index, rather than by time).
fn layout(partitions: usize, grouped: bool) -> StateLayout {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    StateLayout {
        schema: Arc::new(Schema::new(vec![
            Field::new("start", ts.clone(), false),
            Field::new("end", ts, false),
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ])),
        key_columns: 3,
        window_columns: 2,
        time_column: Some(1),
        partitions,
        group_lookups: grouped,
    }
}

fn rows(r: &[(i64, &str, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        layout(1, false).schema,
        vec![
            Arc::new(TimestampMicrosecondArray::from(
                r.iter().map(|x| x.0).collect::<Vec<_>>(),
            )),
            Arc::new(TimestampMicrosecondArray::from(
                r.iter().map(|x| x.0 + 10).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(r.iter().map(|x| x.1).collect::<Vec<_>>())),
            Arc::new(Int64Array::from(r.iter().map(|x| x.2).collect::<Vec<_>>())),
        ],
    )
    .unwrap()
}

fn contents(batches: &[RecordBatch]) -> Vec<(i64, String, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let s = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        let k = b.column(2).as_string::<i32>();
        let n = b.column(3).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((s.value(i), k.value(i).to_string(), n.value(i)));
        }
    }
    out.sort();
    out
}

fn kinds() -> Vec<StoreKind> {
    let mut k = vec![StoreKind::Memory];
    if cfg!(feature = "rocksdb") {
        k.push(StoreKind::Rocksdb);
    }
    k
}

/// Every store, with rows looked up by group or not (the two layouts of the RocksDB store).
fn cases() -> Vec<(StoreKind, bool)> {
    kinds()
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
        .collect()
}

#[test]
fn versions_survive_reopening_and_replays_start_from_the_right_one() {
    for (kind, grouped) in cases() {
        let dir = tempfile::tempdir().unwrap();
        let none = rows(&[]);
        let mut s = open(kind, dir.path(), layout(4, grouped)).unwrap();
        s.load(0).unwrap();
        s.apply(&rows(&[(0, "a", 1), (0, "b", 2), (10, "c", 3)]), &none)
            .unwrap();
        let m = s.commit(1).unwrap();
        assert_eq!(
            (m.rows_total, m.rows_updated, m.rows_removed),
            (3, 3, 0),
            "{kind:?} grouped={grouped}"
        );
        s.maintain().unwrap();
        s.apply(&rows(&[(0, "b", 20)]), &rows(&[(0, "a", 0)]))
            .unwrap();
        let m = s.commit(2).unwrap();
        assert_eq!(
            (m.rows_total, m.rows_updated, m.rows_removed),
            (2, 1, 1),
            "{kind:?} grouped={grouped}"
        );
        // Version 3 is written by a batch that then "crashes": a reload of 2 ignores it.
        s.apply(&rows(&[(20, "z", 9)]), &none).unwrap();
        s.commit(3).unwrap();
        drop(s);

        let mut r = open(kind, dir.path(), layout(4, grouped)).unwrap();
        r.load(2).unwrap();
        assert_eq!(
            contents(&r.rows().unwrap()),
            vec![(0, "b".into(), 20), (10, "c".into(), 3)],
            "{kind:?} grouped={grouped}"
        );
        r.load(1).unwrap();
        assert_eq!(
            contents(&r.rows().unwrap()),
            vec![(0, "a".into(), 1), (0, "b".into(), 2), (10, "c".into(), 3)],
            "{kind:?} grouped={grouped}"
        );
        // Lookups by key, by group, and by time.
        let got = r
            .get(&rows(&[(0, "b", 0), (0, "x", 0), (10, "b", 0)]))
            .unwrap();
        assert_eq!(
            contents(&[got]),
            vec![(0, "b".into(), 2)],
            "{kind:?} grouped={grouped}"
        );
        r.apply(&rows(&[(30, "b", 7)]), &none).unwrap();
        if grouped || kind == StoreKind::Memory {
            let got = r.get_groups(&rows(&[(99, "b", 0)])).unwrap();
            assert_eq!(
                contents(&[got]),
                vec![(0, "b".into(), 2), (30, "b".into(), 7)],
                "{kind:?} grouped={grouped}"
            );
        }
        // Ends are start + 10: 10, 10, 20, 40.
        let got = r.expired(10).unwrap();
        assert_eq!(
            contents(&[got]),
            vec![(0, "a".into(), 1), (0, "b".into(), 2)],
            "{kind:?} grouped={grouped}"
        );
        assert_eq!(
            r.expired(9).unwrap().num_rows(),
            0,
            "{kind:?} grouped={grouped}"
        );
    }
}

#[test]
fn counts_and_the_time_index_follow_updates_removals_and_re_insertions() {
    for (kind, grouped) in cases() {
        let dir = tempfile::tempdir().unwrap();
        let none = rows(&[]);
        let mut s = open(kind, dir.path(), layout(3, grouped)).unwrap();
        s.load(0).unwrap();
        s.apply(&rows(&[(0, "a", 1), (0, "b", 1), (50, "c", 1)]), &none)
            .unwrap();
        // Updates of existing keys, twice in one batch for "a"; a removal of a key that
        // is not there; a key removed and set again in one change (a session that did
        // not move).
        s.apply(&rows(&[(0, "a", 2), (0, "a", 3)]), &rows(&[(0, "zz", 0)]))
            .unwrap();
        s.apply(&rows(&[(0, "b", 5)]), &rows(&[(0, "b", 0)]))
            .unwrap();
        let m = s.commit(1).unwrap();
        assert_eq!(
            (m.rows_total, m.rows_removed),
            (3, 1),
            "{kind:?} grouped={grouped}"
        );
        // Each key once in the time index, whatever the number of writes.
        assert_eq!(
            contents(&[s.expired(10).unwrap()]),
            vec![(0, "a".into(), 3), (0, "b".into(), 5)],
            "{kind:?} grouped={grouped}"
        );
        s.apply(&none, &s.expired(10).unwrap()).unwrap();
        let m = s.commit(2).unwrap();
        assert_eq!(
            (m.rows_total, m.rows_removed),
            (1, 2),
            "{kind:?} grouped={grouped}"
        );
        assert_eq!(
            s.expired(100).unwrap().num_rows(),
            1,
            "{kind:?} grouped={grouped}"
        );
        drop(s);
        let mut r = open(kind, dir.path(), layout(3, grouped)).unwrap();
        r.load(2).unwrap();
        assert_eq!(
            r.expired(10).unwrap().num_rows(),
            0,
            "{kind:?} grouped={grouped}"
        );
        r.apply(&rows(&[(0, "a", 9)]), &none).unwrap();
        let m = r.commit(3).unwrap();
        assert_eq!(m.rows_total, 2, "{kind:?} grouped={grouped}");
        assert_eq!(
            contents(&[r.expired(10).unwrap()]),
            vec![(0, "a".into(), 9)],
            "{kind:?} grouped={grouped}"
        );
    }
}

#[test]
fn snapshots_are_used_and_partitions_and_store_are_fixed() {
    for (kind, grouped) in cases() {
        let dir = tempfile::tempdir().unwrap();
        let none = rows(&[]);
        let mut s = open(kind, dir.path(), layout(2, grouped)).unwrap();
        s.load(0).unwrap();
        for v in 1..=25 {
            s.apply(&rows(&[(0, "k", v), (v, "t", v)]), &none).unwrap();
            s.commit(v as u64).unwrap();
            s.maintain().unwrap();
        }
        drop(s);
        // Version 5 is only needed to load versions before the snapshot of 10.
        let delta = match kind {
            StoreKind::Memory => dir.path().join("5.delta"),
            StoreKind::Rocksdb => dir.path().join("rocksdb/5.changelog"),
        };
        std::fs::remove_file(delta).unwrap();
        let mut r = open(kind, dir.path(), layout(2, grouped)).unwrap();
        r.load(25).unwrap();
        let all = contents(&r.rows().unwrap());
        assert_eq!(all.len(), 26, "{kind:?} grouped={grouped}");
        assert!(
            all.contains(&(0, "k".into(), 25)),
            "{kind:?} grouped={grouped}"
        );
        let e = open(kind, dir.path(), layout(4, grouped))
            .err()
            .expect("other partition count refused");
        assert_eq!(e.sqlstate().code(), "55000");
        assert!(e.to_string().contains("2 partitions"), "{e}");
    }
    if cfg!(feature = "rocksdb") {
        let dir = tempfile::tempdir().unwrap();
        open(StoreKind::Memory, dir.path(), layout(2, false)).unwrap();
        let e = open(StoreKind::Rocksdb, dir.path(), layout(2, false))
            .err()
            .expect("other store refused");
        assert!(e.to_string().contains("state_store 'memory'"), "{e}");
    }
}

/// A small deterministic generator (xorshift64*), so that failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// State rows `(start, end, k, s)` with a text value, whose length changes on update.
fn text_layout(grouped: bool) -> StateLayout {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    StateLayout {
        schema: Arc::new(Schema::new(vec![
            Field::new("start", ts.clone(), false),
            Field::new("end", ts, false),
            Field::new("k", DataType::Utf8, true),
            Field::new("s", DataType::Utf8, true),
        ])),
        key_columns: 3,
        window_columns: 2,
        time_column: Some(1),
        partitions: 3,
        group_lookups: grouped,
    }
}

type Model = std::collections::BTreeMap<(i64, String), String>;

fn text_rows(r: &[(i64, String, String)]) -> RecordBatch {
    RecordBatch::try_new(
        text_layout(false).schema,
        vec![
            Arc::new(TimestampMicrosecondArray::from(
                r.iter().map(|x| x.0).collect::<Vec<_>>(),
            )),
            Arc::new(TimestampMicrosecondArray::from(
                r.iter().map(|x| x.0 + WINDOW).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                r.iter().map(|x| x.1.as_str()).collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                r.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

fn text_contents(batches: &[RecordBatch]) -> Model {
    let mut out = Model::new();
    for b in batches {
        let s = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        let k = b.column(2).as_string::<i32>();
        let v = b.column(3).as_string::<i32>();
        for i in 0..b.num_rows() {
            let old = out.insert((s.value(i), k.value(i).to_string()), v.value(i).to_string());
            assert!(old.is_none(), "a key returned twice");
        }
    }
    out
}

/// Windows of 20 s: a 67 s time bucket of the memory store holds several, so that the
/// watermark often falls inside one.
const WINDOW: i64 = 20_000_000;

/// Random upserts (values of changing length), removals, lookups and evictions over 300
/// versions, checked against a map after every step, with reloads of earlier versions
/// from disk: the same for every store.
#[test]
fn random_changes_match_a_map_at_every_version() {
    for (kind, grouped) in cases() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let mut s = open(kind, dir.path(), text_layout(grouped)).unwrap();
        s.load(0).unwrap();
        let mut model = Model::new();
        let mut versions: Vec<Model> = vec![Model::new()];
        let mut wm = 0i64;
        for v in 1..=300u64 {
            // Upserts around the watermark, some keys written twice in one batch.
            let mut puts = Vec::new();
            for _ in 0..rng.below(400) {
                let start = wm + rng.below(40) as i64 * (WINDOW / 4) - WINDOW;
                let start = start - start.rem_euclid(WINDOW / 4);
                let k = format!("k{}", rng.below(60));
                let len = rng.below(90) as usize;
                let val: String = "x".repeat(len) + &v.to_string();
                puts.push((start, k, val));
            }
            let mut removes = Vec::new();
            for _ in 0..rng.below(30) {
                if let Some(((start, k), _)) =
                    model.iter().nth(rng.below(model.len() as u64 + 1) as usize)
                {
                    removes.push((*start, k.clone(), String::new()));
                }
            }
            s.apply(&text_rows(&puts), &text_rows(&removes)).unwrap();
            for r in &removes {
                model.remove(&(r.0, r.1.clone()));
            }
            for (start, k, val) in puts {
                model.insert((start, k), val);
            }
            // Lookups by key, including absent ones.
            let probe: Vec<_> = (0..20)
                .map(|_| {
                    let start = wm + rng.below(40) as i64 * (WINDOW / 4) - WINDOW;
                    (
                        start - start.rem_euclid(WINDOW / 4),
                        format!("k{}", rng.below(60)),
                        String::new(),
                    )
                })
                .collect();
            let got = text_contents(&[s.get(&text_rows(&probe)).unwrap()]);
            let want: Model = probe
                .iter()
                .filter_map(|p| {
                    model
                        .get_key_value(&(p.0, p.1.clone()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                })
                .collect();
            assert_eq!(got, want, "{kind:?} get at version {v}");
            // Eviction by the watermark, as a range.
            if rng.below(3) == 0 {
                wm += rng.below(3) as i64 * WINDOW / 2 + 1;
                let evicted = text_contents(&[s.evict_expired(wm).unwrap()]);
                let want: Model = model
                    .iter()
                    .filter(|((start, _), _)| start + WINDOW <= wm)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(evicted, want, "{kind:?} evicted at version {v}");
                model.retain(|(start, _), _| start + WINDOW > wm);
                assert_eq!(
                    s.expired(wm).unwrap().num_rows(),
                    0,
                    "{kind:?} grouped={grouped}"
                );
            }
            let m = s.commit(v).unwrap();
            assert_eq!(
                m.rows_total,
                model.len() as u64,
                "{kind:?} count at version {v}"
            );
            s.maintain().unwrap();
            assert_eq!(
                text_contents(&s.rows().unwrap()),
                model,
                "{kind:?} rows at version {v}"
            );
            versions.push(model.clone());
            // Now and then, reopen and load a recent version from disk.
            if rng.below(25) == 0 {
                drop(s);
                let back = rng.below(8).min(v);
                s = open(kind, dir.path(), text_layout(grouped)).unwrap();
                s.load(v - back).unwrap();
                assert_eq!(
                    text_contents(&s.rows().unwrap()),
                    versions[(v - back) as usize],
                    "{kind:?} reload of version {} at {v}",
                    v - back
                );
                s.load(v).unwrap();
                assert_eq!(
                    text_contents(&s.rows().unwrap()),
                    model,
                    "{kind:?} reload at {v}"
                );
            }
        }
    }
}

/// Sessions are found by group, before and after the group index exists and across a
/// reload; replacing a group's sessions removes the old ones.
#[test]
fn sessions_are_found_by_group() {
    for kind in kinds() {
        let dir = tempfile::tempdir().unwrap();
        let none = rows(&[]);
        let mut s = open(kind, dir.path(), layout(2, true)).unwrap();
        s.load(0).unwrap();
        s.apply(&rows(&[(0, "a", 1), (100, "a", 2), (0, "b", 3)]), &none)
            .unwrap();
        let got = s.get_groups(&rows(&[(7, "a", 0), (7, "zz", 0)])).unwrap();
        assert_eq!(
            contents(&[got]),
            vec![(0, "a".into(), 1), (100, "a".into(), 2)],
            "{kind:?}"
        );
        // Merge a's two sessions into one.
        let old = s.get_groups(&rows(&[(7, "a", 0)])).unwrap();
        s.apply(&rows(&[(0, "a", 3)]), &old).unwrap();
        s.apply(&rows(&[(50, "b", 4)]), &none).unwrap();
        let got = s.get_groups(&rows(&[(7, "a", 0), (7, "b", 0)])).unwrap();
        assert_eq!(
            contents(&[got]),
            vec![(0, "a".into(), 3), (0, "b".into(), 3), (50, "b".into(), 4)],
            "{kind:?}"
        );
        s.commit(1).unwrap();
        drop(s);
        let mut r = open(kind, dir.path(), layout(2, true)).unwrap();
        r.load(1).unwrap();
        let got = r.get_groups(&rows(&[(7, "a", 0)])).unwrap();
        assert_eq!(contents(&[got]), vec![(0, "a".into(), 3)], "{kind:?}");
    }
}

/// The memory store's snapshots, written on their own thread (a small state) and in place
/// (a state above `BACKGROUND_SNAPSHOT_MAX_BYTES`): each is in place once `maintain` is
/// waited for (by a load or the drop), old versions go only after it, and a load from the
/// snapshot alone, every delta it covers removed, gives the rows a map of the changes
/// holds.
#[test]
fn memory_snapshots_on_their_own_thread_and_in_place_load_alike() {
    use std::collections::BTreeMap;
    for big in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let none = rows(&[]);
        let mut s = open(StoreKind::Memory, dir.path(), layout(2, false)).unwrap();
        s.load(0).unwrap();
        // Big: 3,000 keys of 100 bytes (above the test build's 256 KiB).
        let width = if big { 3000 } else { 3 };
        let pad = "x".repeat(if big { 100 } else { 1 });
        let mut model = BTreeMap::new();
        let mut snapshot_seen_at_once = Vec::new();
        for v in 1..=125u64 {
            let batch: Vec<(i64, String, i64)> = (0..width)
                .map(|i| {
                    (
                        0,
                        format!("{pad}{}", (i * 7 + v as usize) % (width * 2)),
                        v as i64,
                    )
                })
                .collect();
            for (t, k, n) in &batch {
                model.insert((*t, k.clone()), *n);
            }
            let b: Vec<(i64, &str, i64)> =
                batch.iter().map(|(t, k, n)| (*t, k.as_str(), *n)).collect();
            s.apply(&rows(&b), &none).unwrap();
            s.commit(v).unwrap();
            s.maintain().unwrap();
            if v % 10 == 0 {
                snapshot_seen_at_once.push(dir.path().join(format!("{v}.snapshot")).exists());
            }
            if v == 60 {
                // A load waits for the snapshot under way.
                s.load(60).unwrap();
                assert!(dir.path().join("60.snapshot").exists(), "big={big}");
            }
        }
        if big {
            assert!(snapshot_seen_at_once.iter().all(|&x| x), "written in place");
        }
        drop(s);
        let files = |ext: &str| crate::fsutil::numbered(dir.path(), ext).unwrap();
        // The snapshot of 120 keeps what loading versions from 10 needs.
        assert_eq!(
            files(".snapshot"),
            (1..=12).map(|i| i * 10).collect::<Vec<_>>(),
            "big={big}"
        );
        assert_eq!(files(".delta"), (10..=125).collect::<Vec<_>>(), "big={big}");
        for v in 10..=120 {
            std::fs::remove_file(dir.path().join(format!("{v}.delta"))).unwrap();
        }
        let mut r = open(StoreKind::Memory, dir.path(), layout(2, false)).unwrap();
        r.load(125).unwrap();
        let want: Vec<(i64, String, i64)> =
            model.into_iter().map(|((t, k), n)| (t, k, n)).collect();
        assert_eq!(contents(&r.rows().unwrap()), want, "big={big}");
    }
}
