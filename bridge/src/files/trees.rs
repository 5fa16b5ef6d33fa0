//! Hash trees of files the bridge hashed for a get or checked on a put,
//! kept while the file is unchanged: a get of the same file again (a page
//! resuming a download after a reload, a second device, a photo just put)
//! starts sending at once instead of reading the whole file first (64 MiB
//! took 24 ms to hash here, 1 GiB about 0.4 s).
//!
//! A file is known by its device, inode, size, and modification and change
//! times: any write or rename of it changes one of them. A tree is only a
//! head start: the device checks every group against the hash anyway, so a
//! tree that no longer matches ends a get as `hash mismatch`, never as
//! wrong bytes.

use std::{
    collections::HashMap,
    fs::Metadata,
    os::unix::fs::MetadataExt,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use bao_tree::io::outboard::PreOrderOutboard;

/// One file's tree.
pub type Tree = Arc<PreOrderOutboard<Vec<u8>>>;

/// Bytes of trees kept in all: 64 bytes per 16 KiB group, so 64 MiB of
/// trees covers 16 GiB of files (a device's whole quota).
pub const MAX_KEPT_BYTES: usize = 64 << 20;

/// Trees kept in all, however small: bounds the table and the scan that
/// finds the least recently used one (a file of one group has an empty tree).
pub const MAX_KEPT: usize = 4096;

/// Largest tree kept: a file of up to 1 GiB. A larger file is hashed for
/// each get, as it is the first time; keeping its tree would crowd out
/// many smaller ones.
pub const MAX_TREE_BYTES: usize = 4 << 20;

/// A file modified this recently may still be being written within the
/// filesystem's clock tick (a write in the same tick leaves the times as
/// they were): its tree is not kept from a hash.
pub const SETTLING: Duration = Duration::from_secs(2);

/// What a file is known by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    pub fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The trees kept, least recently used out first.
#[derive(Debug, Default)]
pub struct Trees {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    kept: HashMap<FileKey, (Tree, u64)>,
    bytes: usize,
    clock: u64,
}

impl Trees {
    /// The tree of the file `meta` describes, if it is kept.
    pub fn get(&self, meta: &Metadata) -> Option<Tree> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        let (tree, used) = inner.kept.get_mut(&FileKey::of(meta))?;
        *used = now;
        Some(tree.clone())
    }

    /// Keeps the tree of a file the bridge hashed (`meta` read before the
    /// hash began): not when the file was modified within [`SETTLING`].
    pub fn hashed(&self, meta: &Metadata, tree: Tree, now: SystemTime) {
        let settled =
            meta.modified().ok().and_then(|m| now.duration_since(m).ok()).is_some_and(|d| d >= SETTLING);
        if settled {
            self.keep(FileKey::of(meta), tree);
        }
    }

    /// Keeps the tree of a file the bridge itself wrote and checked
    /// (`meta` read once it was in place).
    pub fn written(&self, meta: &Metadata, tree: Tree) {
        self.keep(FileKey::of(meta), tree);
    }

    fn keep(&self, key: FileKey, tree: Tree) {
        let size = tree.data.len();
        if size > MAX_TREE_BYTES {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        if let Some((old, _)) = inner.kept.insert(key, (tree, now)) {
            inner.bytes -= old.data.len();
        }
        inner.bytes += size;
        while inner.bytes > MAX_KEPT_BYTES || inner.kept.len() > MAX_KEPT {
            let Some(oldest) = inner.kept.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k) else {
                break;
            };
            if let Some((gone, _)) = inner.kept.remove(&oldest) {
                inner.bytes -= gone.data.len();
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().kept.len()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::files::stream;

    fn tree_of(path: &std::path::Path) -> Tree {
        let f = std::fs::File::open(path).unwrap();
        let size = f.metadata().unwrap().len();
        Arc::new(stream::hash_tree(&f, size).unwrap())
    }

    #[test]
    fn a_tree_is_found_while_its_file_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("report.txt");
        std::fs::write(&p, vec![1u8; 100_000]).unwrap();
        let trees = Trees::default();
        let meta = std::fs::metadata(&p).unwrap();
        let later = SystemTime::now() + SETTLING;

        // Just written: not kept from a hash.
        trees.hashed(&meta, tree_of(&p), SystemTime::now());
        assert!(trees.get(&meta).is_none());
        trees.hashed(&meta, tree_of(&p), later);
        assert_eq!(trees.get(&meta).unwrap().root, blake3::hash(&[1u8; 100_000]));

        // Any write is another file.
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"more").unwrap();
        assert!(trees.get(&std::fs::metadata(&p).unwrap()).is_none());
        // So is the same size written again in place.
        std::fs::write(&p, vec![2u8; 100_004]).unwrap();
        assert!(trees.get(&std::fs::metadata(&p).unwrap()).is_none());
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_count_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let trees = Trees::default();
        // Well past every file's writing, however long the loop takes.
        let later = SystemTime::now() + Duration::from_secs(3600);
        let mut metas = Vec::new();
        for i in 0..MAX_KEPT + 2 {
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, [i as u8]).unwrap();
            let meta = std::fs::metadata(&p).unwrap();
            trees.hashed(&meta, tree_of(&p), later);
            metas.push(meta);
            if i == MAX_KEPT - 1 {
                // The first, used again just before the table overflows:
                // the two after it go instead.
                assert!(trees.get(&metas[0]).is_some());
            }
        }
        assert_eq!(trees.len(), MAX_KEPT);
        assert!(trees.get(&metas[0]).is_some(), "used again, it outlived the next two");
        assert!(trees.get(&metas[1]).is_none() && trees.get(&metas[2]).is_none());
        assert!(trees.get(&metas[MAX_KEPT + 1]).is_some());

        // A tree over its bound is not kept at all.
        let big = Arc::new(PreOrderOutboard {
            root: blake3::hash(b""),
            tree: bao_tree::BaoTree::new(0, bao_tree::BlockSize::ZERO),
            data: vec![0u8; MAX_TREE_BYTES + 64],
        });
        let p = dir.path().join("big");
        std::fs::write(&p, b"x").unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        trees.written(&meta, big);
        assert!(trees.get(&meta).is_none());
    }
}
