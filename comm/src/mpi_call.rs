//! How ddl calls MPI: one call at a time unless MPI granted MPI_THREAD_MULTIPLE ([`Serial`]),
//! and MPI's error codes as errors ([`check`]). The transport ([`crate::mpi`]) and the failure
//! notices ([`crate::failure`]) both call MPI this way.

use std::ffi::c_int;
use std::os::raw::c_char;
use std::sync::{Mutex, MutexGuard};

use mpi::environment::Threading;
use mpi::ffi;

use crate::error::{CommError, Result};

/// The lock held around every MPI call, unless MPI granted MPI_THREAD_MULTIPLE.
pub(crate) struct Serial(Option<Mutex<()>>);

impl Serial {
    /// A lock where MPI granted less than MPI_THREAD_MULTIPLE.
    pub(crate) fn new(threading: Threading) -> Serial {
        Serial((threading != Threading::Multiple).then(|| Mutex::new(())))
    }

    /// Held while one MPI call runs (`None`: MPI serialises them itself).
    pub(crate) fn lock(&self) -> Option<MutexGuard<'_, ()>> {
        self.0
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `Ok` for MPI_SUCCESS, otherwise the error with MPI's own message.
pub(crate) fn check(op: &'static str, code: c_int) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let mut buf = vec![0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: MPI_Error_string writes at most MPI_MAX_ERROR_STRING (<= 1024) chars.
    unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    Err(CommError::Mpi {
        op,
        code,
        message: String::from_utf8_lossy(&bytes).into_owned(),
    })
}
