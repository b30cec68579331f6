"""Java contexts: a JVM running JShellKernel.java (JShell, the JDK's REPL
engine), driven over two pipes with jskernel.js's protocol.

As in E2B's Java kernel, environment variables reach Java code as system
properties (System.getProperty): a running JVM's environment cannot change.
"""

import logging
import os

from jscontext import JSContext

log = logging.getLogger("codeinterp")

HERE = os.path.dirname(os.path.abspath(__file__))


class JavaContext(JSContext):
    """A JShell in a JVM of its own.  Its random state is copied into
    forks like a JavaScript context's (java.util.Random and SecureRandom
    instances cannot be reached from outside); an unused context restarts
    on a new machine."""

    # Fast start and small heap: this is an interactive shell.  (The image's
    # class-data archive was made with the same flags: flavor.go's
    # javaKernelFlags.)
    jvm_flags = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
                 "-Xss1m", "-XX:MaxRAMPercentage=50"]

    def __init__(self, server, ctx_id, cwd):
        super().__init__(server, ctx_id, cwd, language="java")

    def _start_process(self):
        jar = os.path.join(HERE, "java", "kernel.jar")  # made by the image (flavor.go)
        if os.path.exists(jar):
            main = ["-cp", jar, "JShellKernel"]
            archive = os.path.join(HERE, "java", "kernel.jsa")
            if os.path.exists(archive):
                main.insert(0, "-XX:SharedArchiveFile=" + archive)
        else:  # not compiled (a host test): java runs the source file
            main = [os.path.join(HERE, "JShellKernel.java")]
        self._start_pipes([self.server.java, *self.jvm_flags, *main], {}, "java")

    def _on_ready(self, msg):
        log.info("java runtime: %s", msg.get("java"))

    def _reseed(self, first):
        log.warning("context %s: the machine id changed but the Java context has state; "
                    "its Random instances continue the copied state", self.id)
