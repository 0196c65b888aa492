/* Entry of the test guest and its interrupt stubs.
 *
 * PVH entry state: 32-bit protected mode, paging off, CR0.PE, flat segments whose
 * descriptors we must not rely on (GDTR is undefined), EBX -> hvm_start_info.
 *
 * Interrupt handlers never use `iret`: KVM's instruction emulator (which runs this
 * whole guest on a PVM host) does not emulate it. A handler returns by rearranging its
 * frame into [EFLAGS][EIP][unused] and doing `popf; ret $4`, which leaves ESP exactly
 * where it was before the interrupt. */

#define XEN_ELFNOTE_PHYS32_ENTRY 18
#define KERNEL_CS 0x08
#define KERNEL_DS 0x10

	.section .note.pvh, "a"
	.p2align 2
	.long 4                        /* namesz: "Xen\0" */
	.long 4                        /* descsz: a 32-bit entry address */
	.long XEN_ELFNOTE_PHYS32_ENTRY
	.asciz "Xen"
	.long pvh_start

	.section .text.entry, "ax"
	.code32
	.globl pvh_start
pvh_start:
	cli
	cld
	mov %ebx, %esi
	lgdt gdt_desc
	ljmp $KERNEL_CS, $1f
1:	mov $KERNEL_DS, %eax
	mov %eax, %ds
	mov %eax, %es
	mov %eax, %fs
	mov %eax, %gs
	mov %eax, %ss
	mov $boot_stack_top, %esp
	push %esi
	call kmain
2:	cli
	hlt
	jmp 2b

/* Loads a null IDT and raises #UD: #UD -> #GP -> #DF cannot be delivered either,
 * so the CPU shuts down (a triple fault, which the VMM must report). `ud2`, not
 * `int3`: the emulator does not emulate software interrupts in protected mode (an
 * emulation failure instead of the triple fault). */
	.globl triple_fault
triple_fault:
	cli
	lidt null_idt_desc
	ud2
3:	hlt
	jmp 3b

/* Application processors start here, in real mode at AP_TRAMPOLINE (the SIPI vector's
 * page): this block is copied there by smp.c, so it refers to itself only relative to
 * its start (DS = CS = the page) and leaves through an absolute far jump. */
	.code16
	.globl ap_trampoline_start, ap_trampoline_end
ap_trampoline_start:
	cli
	cld
	mov %cs, %ax
	mov %ax, %ds
	lgdtl (ap_gdt_desc - ap_trampoline_start)
	mov %cr0, %eax
	or $1, %eax
	mov %eax, %cr0
	ljmpl $KERNEL_CS, $ap_entry32
	.p2align 2
ap_gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt
ap_trampoline_end:

	.code32
ap_entry32:
	mov $KERNEL_DS, %eax
	mov %eax, %ds
	mov %eax, %es
	mov %eax, %fs
	mov %eax, %gs
	mov %eax, %ss
	/* one 4 KiB stack per APIC id (mod 8), so a restarted AP reuses its own */
	mov 0xfee00020, %eax
	shr $24, %eax
	and $7, %eax
	inc %eax
	shl $12, %eax
	add $ap_stacks, %eax
	mov %eax, %esp
	call ap_main
4:	cli
	hlt
	jmp 4b

/* One stub per vector: push a zero where the CPU pushes no error code, then the
 * vector, so every frame looks the same to isr_common. */
.macro isr_stub vec
	.p2align 3
isr_stub_\vec:
	.if (\vec == 8) || ((\vec >= 10) && (\vec <= 14)) || (\vec == 17) || (\vec == 21) || (\vec == 29) || (\vec == 30)
	.else
	push $0
	.endif
	push $\vec
	jmp isr_common
.endm

	.p2align 4
isr_stubs_begin:
.altmacro
.set vec, 0
.rept 256
	isr_stub %vec
	.set vec, vec + 1
.endr

/* Frame after pusha: 0..31 registers, 32 vector, 36 error code, 40 EIP, 44 CS, 48 EFLAGS. */
isr_common:
	pusha
	cld
	push %esp
	call isr_dispatch
	add $4, %esp
	mov 40(%esp), %eax             /* EIP */
	mov 48(%esp), %ebx             /* EFLAGS */
	mov %ebx, 40(%esp)
	mov %eax, 44(%esp)             /* over CS, which never changes here */
	popa
	add $8, %esp                   /* vector and error code */
	popf
	ret $4                         /* to EIP, then drop the last slot */

	.section .rodata
	.p2align 2
	.globl isr_stub_table
isr_stub_table:
.macro stub_addr vec
	.long isr_stub_\vec
.endm
.set vec, 0
.rept 256
	stub_addr %vec
	.set vec, vec + 1
.endr

	.p2align 3
gdt:
	.quad 0
	.quad 0x00cf9a000000ffff       /* 0x08: code, flat 4 GiB, 32-bit */
	.quad 0x00cf92000000ffff       /* 0x10: data, flat 4 GiB */
gdt_end:
	.p2align 2
	.word 0
gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt
	.word 0
null_idt_desc:
	.word 0
	.long 0

	.section .bss
	.p2align 12
	.globl ap_stacks
ap_stacks:
	.skip 4096 * 8
	.p2align 4
boot_stack:
	.skip 32768
boot_stack_top:

	.section .note.GNU-stack, "", @progbits
