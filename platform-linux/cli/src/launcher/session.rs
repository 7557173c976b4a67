//! The job's private session directory.

use super::LaunchError;
use std::fs::{self, DirBuilder};
use std::io::{self};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The job's private directory, removed with its content on drop.
#[derive(Debug)]
pub(super) struct SessionDir {
    pub(super) path: PathBuf,
}

impl SessionDir {
    /// Creates `<base>/btl-<uid>/<job>`, both mode 0700, refusing a parent
    /// that is a symbolic link or belongs to another user.
    pub(super) fn create(base: &Path, uid: u32, job: &str) -> Result<SessionDir, LaunchError> {
        let parent = base.join(format!("btl-{uid}"));
        let err = |path: &Path, action, source| LaunchError::SessionDir {
            path: path.to_owned(),
            action,
            source,
        };
        match DirBuilder::new().mode(0o700).create(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(&parent, "create the parent of the", e)),
        }
        let meta = fs::symlink_metadata(&parent)
            .map_err(|e| err(&parent, "inspect the parent of the", e))?;
        if !meta.is_dir() || meta.uid() != uid {
            return Err(err(
                &parent,
                "use the parent of the",
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("not a directory owned by uid {uid} (owner {})", meta.uid()),
                ),
            ));
        }
        if meta.mode() & 0o777 != 0o700 {
            fs::set_permissions(&parent, fs::Permissions::from_mode(0o700))
                .map_err(|e| err(&parent, "make private the parent of the", e))?;
        }
        let path = parent.join(job);
        DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| err(&path, "create the", e))?;
        let dir = SessionDir { path };
        // The umask may have removed bits; make the mode exact.
        fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o700))
            .map_err(|e| err(&dir.path, "set the mode of the", e))?;
        Ok(dir)
    }
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        match fs::remove_dir_all(&self.path) {
            Ok(()) => log::info!("removed session directory {}", self.path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => log::warn!(
                "cannot remove session directory {}: {e}",
                self.path.display()
            ),
        }
    }
}

/// The base of session directories: `$TMPDIR` if it is an absolute path,
/// else `/tmp`.
pub(super) fn tmp_base() -> PathBuf {
    std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}
