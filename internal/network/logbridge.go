package network

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
)

// gvisor-tap-vsock logs through the global logrus logger. installLogrusBridge
// silences logrus's own output and forwards its entries to slog.Default()
// (component=gvisor-tap-vsock), so that everything ends up in structured
// logs. Only this package uses logrus in this module.
var logrusBridgeOnce sync.Once

func installLogrusBridge() {
	logrusBridgeOnce.Do(func() {
		logrus.SetOutput(io.Discard)
		logrus.AddHook(logrusHook{})
	})
}

type logrusHook struct{}

func (logrusHook) Levels() []logrus.Level { return logrus.AllLevels }

func (logrusHook) Fire(e *logrus.Entry) error {
	var lvl slog.Level
	switch {
	case e.Level <= logrus.ErrorLevel:
		lvl = slog.LevelError
	case e.Level == logrus.WarnLevel:
		lvl = slog.LevelWarn
	case e.Level == logrus.InfoLevel:
		lvl = slog.LevelInfo
	default:
		lvl = slog.LevelDebug
	}
	if strings.HasPrefix(e.Message, "cannot receive packets from") ||
		strings.Contains(e.Message, "broken pipe") ||
		strings.Contains(e.Message, "use of closed network connection") {
		// tap.Switch reports every end of stream (including a normal
		// Close) and writes racing with it as errors; Network logs
		// disconnects itself.
		lvl = slog.LevelDebug
	}
	l := slog.Default()
	ctx := context.Background()
	if !l.Enabled(ctx, lvl) {
		return nil
	}
	attrs := make([]any, 0, 2+2*len(e.Data))
	attrs = append(attrs, "component", "gvisor-tap-vsock")
	for k, v := range e.Data {
		attrs = append(attrs, k, v)
	}
	l.Log(ctx, lvl, e.Message, attrs...)
	return nil
}
