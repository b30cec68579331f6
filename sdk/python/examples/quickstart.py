"""The Python quick start: a VM, a command, a file, a fork, a terminal, and
the same with the async client. Run against a server (AGENTVM_URL and
AGENTVM_TOKEN, or the admin token in the data dir):

    python examples/quickstart.py
"""

import asyncio

from agentvm import AgentVM, AsyncAgentVM

with AgentVM() as av:
    vm = av.vms.create("quickstart-py", memory=512)
    try:
        print(vm.exec("uname -sr").stdout, end="")
        vm.files.write("/root/hello.txt", "hello from python\n")
        print(vm.exec("cat /root/hello.txt").stdout, end="")

        # a live process: write to it, read from it
        with vm.spawn(["python3", "-c", "import sys; print(sys.stdin.read().upper())"]) as p:
            p.close_stdin("shout")
            print(p.wait().text, end="")

        # fork the running VM: the copy has its memory and processes
        child = vm.fork().children[0]
        print("child sees:", child.exec("cat /root/hello.txt").stdout, end="")
        child.delete()

        # a terminal that keeps running with nobody attached
        vm.terminals.create("main")
        with vm.terminals.attach("main") as term:
            term.write("echo from-the-terminal\n")
            out = b""
            while b"from-the-terminal\r\n" not in out:
                out += term.read(timeout=60) or b""
        print("terminal ok")
    finally:
        vm.delete()


async def main() -> None:
    async with AsyncAgentVM() as av:
        vm = await av.vms.create("quickstart-py-async", memory=512)
        try:
            results = await asyncio.gather(*(vm.exec(f"echo {i}") for i in range(3)))
            print("async:", [r.stdout.strip() for r in results])
        finally:
            await vm.delete()


asyncio.run(main())
