// Writes the kernel loader's seed images (native/fuzz/corpus/kernel_loader):
// the tiny guests of test/vmm-guests.ts, one per form the loader accepts.
//   node --import tsx native/fuzz/make_kernel_seeds.ts
import { writeFileSync } from 'node:fs';

import { INT3_LOOP, bzImage, elf64, pvhElf32 } from '../../test/vmm-guests.js';

const dir = 'native/fuzz/corpus/kernel_loader';
writeFileSync(`${dir}/pvh-elf32`, pvhElf32());
writeFileSync(`${dir}/pvh-elf32-int3`, pvhElf32(INT3_LOOP));
writeFileSync(`${dir}/elf64`, elf64());
writeFileSync(`${dir}/bzimage`, bzImage());
