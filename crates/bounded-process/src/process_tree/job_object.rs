//! A Windows Job object owned by the runner: the only `unsafe` code of the crate, each call
//! with the reason it is sound.

use std::io;
use std::os::windows::io::{AsRawHandle as _, FromRawHandle as _, OwnedHandle, RawHandle};

use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectExtendedLimitInformation,
    SetInformationJobObject, TerminateJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
};

/// The exit code every process of a terminated job gets (what `TerminateProcess` uses too).
const TERMINATED_EXIT_CODE: u32 = 1;

/// An unnamed Job object; its handle closes on drop.
pub(crate) struct JobObject {
    handle: OwnedHandle,
}

impl JobObject {
    /// A new job whose members are killed when its last handle closes.
    pub(crate) fn kill_on_close() -> io::Result<JobObject> {
        // SAFETY: null attributes and a null name ask for an unnamed job with default security;
        // neither pointer is read.
        let raw = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if raw.is_null() {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh, valid handle that nothing else owns or closes.
        let handle = unsafe { OwnedHandle::from_raw_handle(raw) };
        let job = JobObject { handle };
        job.set_limit_flags(JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE)?;
        Ok(job)
    }

    /// Puts the process behind `process` (a live process handle, e.g. a tokio child's) into
    /// the job; processes it starts from now on join the job too.
    pub(crate) fn assign(&self, process: RawHandle) -> io::Result<()> {
        // SAFETY: both handles are valid for the call: the job is owned by `self` and the caller
        // holds the process handle's owner (the unreaped child) across it.
        let assigned = unsafe { AssignProcessToJobObject(self.handle.as_raw_handle(), process) };
        os_result(assigned)
    }

    /// Terminates every process in the job.
    pub(crate) fn terminate(&self) -> io::Result<()> {
        // SAFETY: the job handle is owned by `self` and open for the call.
        let terminated =
            unsafe { TerminateJobObject(self.handle.as_raw_handle(), TERMINATED_EXIT_CODE) };
        os_result(terminated)
    }

    /// Clears the kill-on-close limit, then closes the handle: the members keep running.
    pub(crate) fn keep_members_on_close(self) -> io::Result<()> {
        self.set_limit_flags(0)
    }

    fn set_limit_flags(&self, flags: u32) -> io::Result<()> {
        let mut limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        limits.BasicLimitInformation.LimitFlags = flags;
        let size = u32::try_from(std::mem::size_of_val(&limits))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the job handle is open; the pointer and size describe `limits`, a live value
        // of exactly the structure this information class names, only read during the call.
        let set = unsafe {
            SetInformationJobObject(
                self.handle.as_raw_handle(),
                JobObjectExtendedLimitInformation,
                std::ptr::from_ref(&limits).cast(),
                size,
            )
        };
        os_result(set)
    }
}

/// A Win32 `BOOL` result: zero means failure, with the reason in the thread's last error.
fn os_result(succeeded: i32) -> io::Result<()> {
    if succeeded == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
