//! Opening files pieval did not write — a run folder, an envelope, a judge's rubric — in
//! one way: only a regular file (a FIFO would block the reader forever, `/dev/zero`
//! never ends, a folder is not a file), never through a symbolic link when the file sits
//! in a folder someone else may have made, and read with a bound. The writes' one helper
//! is in the `atomic` module.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Whether the last component of a path may be a symbolic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// The user's own path (a config, a corpus): a link is theirs to make.
    Follow,
    /// Inside a folder that may come from someone else: a link is an error.
    Refuse,
}

/// Open `path` for reading: a regular file, or an error naming it. Opened non-blocking
/// (so a FIFO does not hang the open) and, with [`Links::Refuse`], with `O_NOFOLLOW`, so
/// a link swapped in after a check is not followed either.
pub fn open_regular(path: &Path, links: Links) -> Result<File> {
    open_as(path, links, "cannot open")
}

/// [`open_regular`] of the user's own input file, its errors saying what it is
/// (`cannot`: `"cannot open corpus"`).
pub fn open_input(path: &Path, cannot: &'static str) -> Result<File> {
    open_as(path, Links::Follow, cannot)
}

fn open_as(path: &Path, links: Links, cannot: &'static str) -> Result<File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut flags = libc::O_NONBLOCK;
        if links == Links::Refuse {
            flags |= libc::O_NOFOLLOW;
        }
        opts.custom_flags(flags);
    }
    let file = match opts.open(path) {
        Ok(f) => f,
        // O_NOFOLLOW on a link: ELOOP.
        #[cfg(unix)]
        Err(e) if links == Links::Refuse && e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::State(format!(
                "{}: a symbolic link is not followed here (the folder may come from someone else)",
                path.display()
            )));
        }
        Err(e) => return Err(Error::io(path, cannot, e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?;
    if !meta.is_file() {
        return Err(Error::State(format!(
            "{}: not a regular file (a {}); pieval reads only regular files here",
            path.display(),
            kind(&meta)
        )));
    }
    Ok(file)
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "device";
        }
        if t.is_socket() {
            return "socket";
        }
    }
    if meta.is_dir() {
        "folder"
    } else {
        "special file"
    }
}

/// The whole of a regular file of at most `max` bytes; a larger one is an error naming
/// it and the bound (checked on the size first, and again while reading, since a file
/// can grow).
pub fn read_bounded(path: &Path, links: Links, max: u64) -> Result<Vec<u8>> {
    let file = open_regular(path, links)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read", e))?
        .len();
    let too_big = || {
        Error::State(format!(
            "{}: larger than {} — not read (a file of this kind is never that large)",
            path.display(),
            human(max)
        ))
    };
    if len > max {
        return Err(too_big());
    }
    let mut out = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::io(path, "cannot read", e))?;
    if out.len() as u64 > max {
        return Err(too_big());
    }
    Ok(out)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text_bounded(path: &Path, links: Links, max: u64) -> Result<String> {
    String::from_utf8(read_bounded(path, links, max)?)
        .map_err(|_| Error::input(path, 0, None, "not valid UTF-8"))
}

/// A size for a message: `N MiB`, or `N KiB` under a mebibyte.
pub fn human(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", (bytes >> 10).max(1))
    }
}

/// Bounds on what pieval reads whole from a file someone else may have written.
pub mod bounds {
    /// `manifest.json` (a config snapshot and the selected case ids).
    pub const MANIFEST: u64 = 256 << 20;
    /// `summary.json`.
    pub const SUMMARY: u64 = 64 << 20;
    /// A DSSE envelope or the controls folder's index.
    pub const ENVELOPE: u64 = 64 << 20;
    /// A key file, a rubric, a judge or experiment config.
    pub const SMALL_TEXT: u64 = 16 << 20;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read_and_with_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.json");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_bounded(&f, Links::Refuse, 10).unwrap(), b"0123456789");
        let e = read_bounded(&f, Links::Refuse, 9).unwrap_err().to_string();
        assert!(e.contains("a.json") && e.contains("larger than"), "{e}");
        // A link: refused inside a received folder, followed for the user's own path.
        #[cfg(unix)]
        {
            let l = dir.path().join("link.json");
            std::os::unix::fs::symlink(&f, &l).unwrap();
            let e = open_regular(&l, Links::Refuse).unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{e}");
            assert!(open_regular(&l, Links::Follow).is_ok());
            // Devices and FIFOs: an error at once, never a read that does not end.
            let e = open_regular(Path::new("/dev/zero"), Links::Follow)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not a regular file (a device)"), "{e}");
            let fifo = dir.path().join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let e = open_regular(&fifo, Links::Refuse).unwrap_err().to_string();
            assert!(e.contains("FIFO"), "{e}");
        }
        let e = open_regular(dir.path(), Links::Follow)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
