// A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) makes the process print one line naming it and the
// stack's return addresses to stderr before it dies of that signal, as llama.cpp and vLLM's workers do: what an
// operator pastes into a bug report (`addr2line -e paged` turns the offsets into lines).
#pragma once

namespace paged::cli {

/// Installs the handlers, on an alternate signal stack for the calling thread (a stack overflow there is reported
/// too; on another thread it still dies of SIGSEGV). Call once, early, on the main thread.
void install_crash_report();

}  // namespace paged::cli
