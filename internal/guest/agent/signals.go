package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// inheritableSignals are the signals whose disposition the programs the
// agent starts (exec, terminals, jobs) must find at its default.
var inheritableSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
	syscall.SIGPIPE, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM,
}

var uninheritOnce sync.Once

// uninheritIgnoredSignals stops signals that were ignored when the agent
// started from staying ignored in every process it starts: execve keeps
// SIG_IGN but resets caught signals to SIG_DFL. A signal that arrives
// ignored is therefore caught and dropped instead, which keeps the agent's
// own behaviour. Found when the unit tests ran under nohup: the shells of
// deleted terminals ignored SIGHUP, so a hangup neither ran their traps
// nor reached their background jobs.
func uninheritIgnoredSignals() {
	uninheritOnce.Do(func() {
		var sigs []os.Signal
		for _, s := range inheritableSignals {
			if signal.Ignored(s) {
				sigs = append(sigs, s)
			}
		}
		if len(sigs) > 0 {
			// Delivery never blocks: the runtime drops what does not fit.
			signal.Notify(make(chan os.Signal, 1), sigs...)
		}
	})
}
