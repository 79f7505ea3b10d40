/* backend-jail: clone3(2) with CLONE_VM on a stack of the caller's, calling a function in
 * the child: what glibc's internal __clone3 does for posix_spawn(3), which glibc does not
 * export. Why the jail wants it is in jail.c (the sandbox's first process shares the host's
 * memory until its exec instead of taking a copy-on-write copy of a daemon's).
 *
 * The raw system call cannot be made from C: with CLONE_VM the child returns from it on the
 * new stack, where a C function has no frame to return through. So a few instructions per
 * architecture: keep fn and arg in registers the kernel leaves alone, trap, and in the child
 * clear the frame pointer, call fn(arg) and exit with its result (it normally never
 * returns: it execs). Elsewhere jail_clone3_vm_supported is false and jail.c clones the way
 * it did before (a copy of the host's memory). */
#include "config.h"

#include <errno.h>
#include <linux/sched.h>
#include <stddef.h>
#include <sys/syscall.h>

#include "jail.h"

#define STR_(x) #x
#define STR(x) STR_(x)

#if defined(__x86_64__) && defined(SYS_clone3)

const bool jail_clone3_vm_supported = true;

/* long jail_clone3_vm_raw(struct clone_args *ca [rdi], size_t size [rsi],
 *                         int (*fn)(void *) [rdx], void *arg [rcx])
 * syscall clobbers rcx and r11 only; r8 and r9 carry fn and arg into the child, whose
 * registers are the parent's but rax (0) and rsp (the new stack's top, 16-byte aligned by
 * the caller, so fn is entered with the ABI's alignment after the call's push). */
/* One instruction a line, as written: clang-format splits the string at STR(). */
/* clang-format off */
__asm__(".text\n"
        ".p2align 4\n"
        ".globl jail_clone3_vm_raw\n"
        ".hidden jail_clone3_vm_raw\n"
        ".type jail_clone3_vm_raw,@function\n"
        "jail_clone3_vm_raw:\n"
        "  .cfi_startproc\n"
        "  endbr64\n"
        "  mov %rdx, %r8\n"
        "  mov %rcx, %r9\n"
        "  mov $" STR(SYS_clone3) ", %eax\n"
        "  syscall\n"
        "  test %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  .cfi_undefined %rip\n"
        "  xor %ebp, %ebp\n"
        "  mov %r9, %rdi\n"
        "  call *%r8\n"
        "  mov %eax, %edi\n"
        "  mov $" STR(SYS_exit_group) ", %eax\n"
        "  syscall\n"
        "  hlt\n"
        "  .cfi_endproc\n"
        ".size jail_clone3_vm_raw, .-jail_clone3_vm_raw\n"
        ".previous\n");
/* clang-format on */

long jail_clone3_vm_raw(struct clone_args *ca, size_t size, int (*fn)(void *), void *arg);

long
jail_clone3_vm(struct clone_args *ca, int (*fn)(void *), void *arg)
{
  long r = jail_clone3_vm_raw(ca, sizeof *ca, fn, arg);
  if (r < 0 && r > -4096) {
    errno = (int)-r;
    return -1;
  }
  return r;
}

#else

const bool jail_clone3_vm_supported = false;

long
jail_clone3_vm(struct clone_args *ca, int (*fn)(void *), void *arg)
{
  (void)ca;
  (void)fn;
  (void)arg;
  errno = ENOSYS;
  return -1;
}

#endif
