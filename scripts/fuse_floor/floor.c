/* The floor of any FUSE filesystem on this machine: a C low-level libfuse daemon that serves
 * D directories of F files of SZ bytes each from memory, in no-open mode with readdirplus.
 * Nothing a Python daemon could do per request is cheaper than this. Built and run by
 * scripts/fuse_floor/run; usage: floor MOUNTPOINT [DIRS FILES SIZE] (serves in the foreground). */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
/* D dirs under root, each with F files of SZ bytes. inode: 1 root, 2..D+1 dirs, then files */
static int D=400, F=40, SZ=6000; static char *content;
static int isdir(fuse_ino_t i){return i>=2 && i<(fuse_ino_t)D+2;}
static void fill(fuse_ino_t ino, struct stat *st){memset(st,0,sizeof *st);st->st_ino=ino;
 if(ino==1||isdir(ino)){st->st_mode=S_IFDIR|0555;st->st_nlink=2;}else{st->st_mode=S_IFREG|0444;st->st_nlink=1;st->st_size=SZ;}}
static void mkentry(fuse_ino_t ino, struct fuse_entry_param *e){memset(e,0,sizeof *e);e->ino=ino;e->attr_timeout=3600;e->entry_timeout=3600;fill(ino,&e->attr);}
static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name){struct fuse_entry_param e; int n;
 if(parent==1 && sscanf(name,"d%d",&n)==1 && n<D){mkentry(2+n,&e);fuse_reply_entry(req,&e);return;}
 if(isdir(parent) && sscanf(name,"f%d.md",&n)==1 && n<F){mkentry(D+2+(parent-2)*F+n,&e);fuse_reply_entry(req,&e);return;}
 fuse_reply_err(req,ENOENT);}
static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi){struct stat st;fill(ino,&st);fuse_reply_attr(req,&st,3600);}
static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi){fuse_reply_err(req,ENOSYS);}
static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi){
 if(off>=SZ){fuse_reply_buf(req,NULL,0);return;} if(off+size>(size_t)SZ) size=SZ-off; fuse_reply_buf(req,content+off,size);}
static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi){
 char *buf=malloc(size); size_t pos=0; int count = ino==1?D:F; char name[64]; struct fuse_entry_param e;
 for(int i=off;i<count;i++){ fuse_ino_t child = ino==1? 2+i : D+2+(ino-2)*F+i;
  if(ino==1) sprintf(name,"d%d",i); else sprintf(name,"f%d.md",i); mkentry(child,&e);
  size_t l=fuse_add_direntry_plus(req,buf+pos,size-pos,name,&e,i+1); if(l>size-pos)break; pos+=l;}
 fuse_reply_buf(req,buf,pos); free(buf);}
static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi){fuse_reply_err(req,ENOSYS);}
static void ll_init(void *u, struct fuse_conn_info *c){ c->want |= FUSE_CAP_READDIRPLUS; c->want &= ~FUSE_CAP_READDIRPLUS_AUTO;}
static const struct fuse_lowlevel_ops ops={.init=ll_init,.lookup=ll_lookup,.getattr=ll_getattr,.open=ll_open,.read=ll_read,.readdirplus=ll_readdirplus,.opendir=ll_opendir};
int main(int argc,char**argv){ if(argc<2) return 2; if(argc==5){D=atoi(argv[2]);F=atoi(argv[3]);SZ=atoi(argv[4]);} content=malloc(SZ); for(int i=0;i<SZ;i++) content[i]= (i%64==63)?'\n':'a'+(i*7)%26;
 char *fargv[]={argv[0],"-o","ro,default_permissions",NULL}; struct fuse_args args=FUSE_ARGS_INIT(3,fargv);
 struct fuse_session *se=fuse_session_new(&args,&ops,sizeof ops,NULL); if(fuse_session_mount(se,argv[1])) return 1;
 fuse_daemonize(1); int r=fuse_session_loop(se); fuse_session_unmount(se); return r;}
