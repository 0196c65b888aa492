/* GROW_FS: grow a mounted ext4 filesystem online to fill its block device (docs/protocol.md).
 *
 * A sandbox restored from a template into a larger disk: the VMM signals a virtio config
 * change, the guest kernel's virtio-blk driver updates the disk's capacity (from a work queue,
 * so a little later), and the host asks this until the device shows the size it expects. The
 * resize is the kernel's EXT4_IOC_RESIZE_FS on the mount itself, so an image without
 * resize2fs grows too. Never blocks for long: a device not grown yet answers at once with its
 * size, and the host asks again. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dispatch.h"
#include "errors.h"
#include "handlers.h"

/* <linux/ext4.h> is not a UAPI header everywhere: the ioctl's number as fs/ext4/ext4.h has it. */
#ifndef EXT4_IOC_RESIZE_FS
#define EXT4_IOC_RESIZE_FS _IOW('f', 16, uint64_t)
#endif
#define EXT4_MAGIC 0xEF53

/* Bytes of the block device `dev` from /sys/dev/block/M:m/size (512-byte sectors, as the
 * kernel updates it on a capacity change); 0 and errno set when it cannot be read. */
static uint64_t device_bytes(dev_t dev) {
  char path[64], buf[32];
  snprintf(path, sizeof path, "/sys/dev/block/%u:%u/size", major(dev), minor(dev));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int err = errno;
  close(fd);
  if (n <= 0) {
    errno = n < 0 ? err : EIO;
    return 0;
  }
  buf[n] = 0;
  char *end;
  errno = 0;
  unsigned long long sectors = strtoull(buf, &end, 10);
  if (errno || end == buf || sectors > UINT64_MAX / 512) {
    errno = EIO;
    return 0;
  }
  return (uint64_t)sectors * 512;
}

void handle_grow_fs(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  char *path = NULL;
  uint64_t want = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_PATH && field_cstr(&fl, &path) != 0) {
      free(path);
      answer_error(s, CODE_INVALID_ARGUMENT, 0, "path holds a NUL byte");
      return;
    }
    if (fl.tag == TP_T_SIZE) tp_field_u64(&fl, &want);
  }
  const char *mount = path ? path : "/";
  int fd = open(mount, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct stat st;
  struct statfs sf;
  if (fd < 0 || fstat(fd, &st) != 0 || fstatfs(fd, &sf) != 0) {
    answer_errno(s, errno, mount);
    goto out;
  }
  if ((unsigned long)sf.f_type != EXT4_MAGIC) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "not an ext4 filesystem: only ext4 grows online");
    goto out;
  }
  uint64_t dev = device_bytes(st.st_dev);
  if (dev == 0) {
    answer_errno(s, errno ? errno : EIO, "the filesystem's block device size (/sys/dev/block)");
    goto out;
  }
  const char *note = NULL;
  /* Grow only once the device shows the size the host expects (the driver updates it
   * asynchronously), and never on a host: a test must not resize the host's disk. */
  if (dev >= want && sf.f_bsize > 0) {
    if (!dispatch_init_mode()) {
      note = "host mode: not resized";
    } else {
      uint64_t blocks = dev / (uint64_t)sf.f_bsize;
      if (ioctl(fd, EXT4_IOC_RESIZE_FS, &blocks) != 0) {
        answer_errno(s, errno, "EXT4_IOC_RESIZE_FS");
        goto out;
      }
      if (fstatfs(fd, &sf) != 0) {
        answer_errno(s, errno, mount);
        goto out;
      }
    }
  }
  struct tp_writer w;
  if (answer_begin(s, &w, 3 * TP_FIELD_HEADER_SIZE + 16 + 64, TP_OK) != 0) goto out;
  tp_put_u64(&w, TP_T_SIZE, dev);
  tp_put_u64(&w, TP_T_FS_SIZE, (uint64_t)sf.f_blocks * (uint64_t)(sf.f_frsize ? sf.f_frsize : sf.f_bsize));
  if (note) tp_put_str(&w, TP_T_MESSAGE, note);
  answer_end(s, &w);
out:
  if (fd >= 0) close(fd);
  free(path);
}
