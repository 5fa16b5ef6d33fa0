//! The verified encoding a file travels in (bao-tree's, chunk groups of
//! [`BLOCK_SIZE`]): what a sender writes from a file and its hash tree, and
//! what a receiver checks group by group against the file's BLAKE3 hash
//! before it writes a byte. Blocking I/O: callers run these on a blocking
//! thread, over a stream bridged to it.

use std::{
    fs::File,
    io::{self, BufReader, Read, Seek, Write},
    os::unix::fs::FileExt,
};

use bao_tree::{
    io::{
        outboard::PreOrderOutboard,
        sync::{encode_ranges, CreateOutboard, DecodeResponseIter},
        BaoContentItem, DecodeError, EncodeError, Leaf,
    },
    BaoTree, BlockSize, ChunkNum, ChunkRanges,
};
use thunderbolt_shared::files::BLOCK_CHUNK_LOG;

/// What can end a transfer.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A chunk group or a node of the tree does not hash to what the file's
    /// hash says: the sender lied, or the bytes were damaged.
    #[error("hash mismatch at byte {0}")]
    Mismatch(u64),
    /// The stream ended (or broke) before the last byte.
    #[error("transfer cut short: {0}")]
    Cut(io::Error),
    /// The file could not be read or written here.
    #[error("{0}")]
    File(io::Error),
}

fn block_size() -> BlockSize {
    BlockSize::from_chunk_log(BLOCK_CHUNK_LOG)
}

/// The chunks from byte `from` (a multiple of [`BLOCK_SIZE`]) to the end.
fn from_byte(from: u64) -> ChunkRanges {
    ChunkRanges::from(ChunkNum(from / 1024)..)
}

/// The hash tree of the first `size` bytes of `file` (read once, from its
/// start): 64 bytes per chunk group, 4 MiB for a 1 GiB file.
pub fn hash_tree(file: &File, size: u64) -> io::Result<PreOrderOutboard<Vec<u8>>> {
    let mut f = file.try_clone()?;
    f.rewind()?;
    PreOrderOutboard::<Vec<u8>>::create_sized(
        BufReader::with_capacity(1 << 20, f.take(size)),
        size,
        block_size(),
    )
}

/// The file's BLAKE3 hash, as the wire writes it.
pub fn hex(tree: &PreOrderOutboard<Vec<u8>>) -> String {
    tree.root.to_hex().to_string()
}

/// Writes the encoding of `file` from byte `from` to the end into `out`.
/// The groups are not hashed again here: the receiver checks every one, so
/// a file changed since its tree was made ends there as `hash mismatch`
/// (hashing each group twice cost a tenth of a get's throughput).
pub fn send(
    file: &File,
    tree: &PreOrderOutboard<Vec<u8>>,
    from: u64,
    out: impl Write,
) -> Result<(), StreamError> {
    if from >= tree.tree.size() {
        return Ok(());
    }
    encode_ranges(file, tree, &from_byte(from), out).map_err(|e| match e {
        EncodeError::Io(e) => {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                StreamError::File(e)
            } else {
                StreamError::Cut(e)
            }
        }
        EncodeError::ParentHashMismatch(_) | EncodeError::LeafHashMismatch(_) => {
            StreamError::File(io::Error::other("the file changed while it was being sent"))
        }
        other => StreamError::File(io::Error::other(other.to_string())),
    })
}

/// Reads the encoding of a file of `size` bytes hashing to `hash` from byte
/// `from` on, checks every group and writes it into `file` at its offset;
/// `progress` is told the offset reached after each group.
pub fn receive(
    file: &File,
    size: u64,
    hash: &str,
    from: u64,
    input: impl Read,
    progress: impl FnMut(u64),
) -> Result<(), StreamError> {
    receive_keeping(file, size, hash, from, input, progress, None)
}

/// [`receive`], and when it ran from the start, the file's hash tree, made
/// of the nodes the stream carried (every one was checked on the way):
/// what a later get of the file sends without reading it all first. Not
/// kept for a tree over `max_tree` bytes (the caller's memory bound).
pub fn receive_tree(
    file: &File,
    size: u64,
    hash: &str,
    input: impl Read,
    progress: impl FnMut(u64),
    max_tree: usize,
) -> Result<Option<PreOrderOutboard<Vec<u8>>>, StreamError> {
    let tree = BaoTree::new(size, block_size());
    let wanted = tree.outboard_size();
    let mut nodes = (wanted <= max_tree as u64).then(|| Vec::with_capacity(wanted as usize));
    receive_keeping(file, size, hash, 0, input, progress, nodes.as_mut())?;
    let Some(data) = nodes else { return Ok(None) };
    let root = blake3::Hash::from_hex(hash).map_err(|_| StreamError::Mismatch(0))?;
    // The stream carries every node in pre-order when it runs from byte 0:
    // exactly the outboard's layout; anything else is not kept.
    Ok((data.len() as u64 == wanted).then_some(PreOrderOutboard { root, tree, data }))
}

fn receive_keeping(
    file: &File,
    size: u64,
    hash: &str,
    from: u64,
    input: impl Read,
    mut progress: impl FnMut(u64),
    mut nodes: Option<&mut Vec<u8>>,
) -> Result<(), StreamError> {
    let root = blake3::Hash::from_hex(hash).map_err(|_| StreamError::Mismatch(0))?;
    if size == 0 {
        return if root == blake3::hash(b"") { Ok(()) } else { Err(StreamError::Mismatch(0)) };
    }
    if from >= size {
        return Ok(());
    }
    let ranges = from_byte(from);
    let tree = BaoTree::new(size, block_size());
    for item in DecodeResponseIter::new(root, tree, input, &ranges) {
        match item {
            Ok(BaoContentItem::Leaf(Leaf { offset, data })) => {
                file.write_all_at(&data, offset).map_err(StreamError::File)?;
                progress(offset + data.len() as u64);
            }
            Ok(BaoContentItem::Parent(p)) => {
                if let Some(nodes) = nodes.as_deref_mut() {
                    nodes.extend_from_slice(p.pair.0.as_bytes());
                    nodes.extend_from_slice(p.pair.1.as_bytes());
                }
            }
            Err(DecodeError::LeafHashMismatch(chunk)) => return Err(StreamError::Mismatch(chunk.0 * 1024)),
            Err(DecodeError::ParentHashMismatch(node)) => {
                return Err(StreamError::Mismatch(node.chunk_range().start.0 * 1024))
            }
            Err(DecodeError::Io(e)) => return Err(StreamError::Cut(e)),
            Err(other) => return Err(StreamError::Cut(io::Error::other(other.to_string()))),
        }
    }
    Ok(())
}

/// A reader that counts what went through it (the bytes on the wire).
pub struct Counted<R> {
    pub inner: R,
    pub count: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

/// A writer that counts what went through it.
pub struct CountedWrite<W> {
    pub inner: W,
    pub count: u64,
}

impl<W: Write> Write for CountedWrite<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use thunderbolt_shared::files::BLOCK_SIZE;

    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, bytes).unwrap();
        let f = File::options().read(true).write(true).open(&p).unwrap();
        (dir, f)
    }

    #[test]
    fn a_file_crosses_whole_or_from_where_it_was_cut_and_a_lie_is_caught() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (_d, src) = file_with(&data);
        let tree = hash_tree(&src, data.len() as u64).unwrap();
        assert_eq!(hex(&tree), blake3::hash(&data).to_hex().as_str());

        let mut wire = Vec::new();
        send(&src, &tree, 0, &mut wire).unwrap();
        let (_e, dst) = file_with(b"");
        receive(&dst, data.len() as u64, &hex(&tree), 0, &wire[..], |_| {}).unwrap();
        let mut got = Vec::new();
        (&dst).read_to_end(&mut got).unwrap();
        assert_eq!(got, data);

        // From the fourth group on: only what was missing crosses.
        let from = 3 * BLOCK_SIZE;
        let mut rest = Vec::new();
        send(&src, &tree, from, &mut rest).unwrap();
        assert!(rest.len() < wire.len() - from as usize + 1024, "{} of {}", rest.len(), wire.len());
        let (_f, part) = file_with(&data[..from as usize]);
        receive(&part, data.len() as u64, &hex(&tree), from, &rest[..], |_| {}).unwrap();
        let mut got = Vec::new();
        (&part).read_to_end(&mut got).unwrap();
        assert_eq!(got, data);

        // A lying hash: caught at the first group, before it is written.
        let other = blake3::hash(b"something else").to_hex().to_string();
        let (_g, dst) = file_with(b"");
        let r = receive(&dst, data.len() as u64, &other, 0, &wire[..], |_| {});
        assert!(matches!(r, Err(StreamError::Mismatch(0))), "{r:?}");
        assert_eq!(dst.metadata().unwrap().len(), 0);

        // Damaged in the middle: what came before it is kept, nothing after.
        let mut bad = wire.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 1;
        let (_h, dst) = file_with(b"");
        let mut reached = 0;
        let r = receive(&dst, data.len() as u64, &hex(&tree), 0, &bad[..], |n| reached = n);
        assert!(matches!(r, Err(StreamError::Mismatch(_))), "{r:?}");
        assert!(reached > 0 && reached < data.len() as u64);

        // Received from the start, the tree it carried is the file's own.
        let (_t, dst) = file_with(b"");
        let kept = receive_tree(&dst, data.len() as u64, &hex(&tree), &wire[..], |_| {}, 1 << 20).unwrap();
        let kept = kept.expect("a tree within the bound is kept");
        assert_eq!((kept.root, kept.tree, &kept.data), (tree.root, tree.tree, &tree.data));
        assert!(!kept.data.is_empty());
        let (_u, dst) = file_with(b"");
        let over = receive_tree(&dst, data.len() as u64, &hex(&tree), &wire[..], |_| {}, 64).unwrap();
        assert!(over.is_none(), "a tree over its bound is not kept");

        // Cut short.
        let (_i, dst) = file_with(b"");
        let r = receive(&dst, data.len() as u64, &hex(&tree), 0, &wire[..mid], |_| {});
        assert!(matches!(r, Err(StreamError::Cut(_))), "{r:?}");
    }
}
