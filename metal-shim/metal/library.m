// cherenkov.h over Metal: the kernel library (compiled from kernels/*.metal at
// load) and compute pipelines looked up by name.
//
// Each .metal file is compiled as its own MTLLibrary, as the CPU backend
// compiles each as its own translation unit: two files may then both define
// the same static helper, and a kernel name defined twice is an error here.
// Quoted includes that name a file in the same directory (kernels/params.h)
// are inlined where they stand, with #line directives so compiler messages
// name the real file and line: newLibraryWithSource has no include path.
//
// Caching, per process (every device of a process is the one system GPU): a
// compiled library is kept in a dictionary keyed by its complete expanded
// source text (NSDictionary hashes the text and compares it in full, so a
// changed kernel is never served stale), and a pipeline by its compiled
// library and kernel name. Opening another device or loading the model again
// compiles nothing; pipelines are built on first use, so kernels a process
// never dispatches (the self-tests) are never built. Across processes, macOS
// keeps its own shader cache; nothing here depends on it.
#import "shim.h"

@implementation CherenkovPipeline
@end
@implementation CherenkovLibrary
@end

// The file name of `line` if it is `#include "name"`, else nil.
static NSString *quoted_include(NSString *line) {
  NSString *t = [line stringByTrimmingCharactersInSet:NSCharacterSet.whitespaceCharacterSet];
  if (![t hasPrefix:@"#"]) return nil;
  t = [[t substringFromIndex:1] stringByTrimmingCharactersInSet:NSCharacterSet.whitespaceCharacterSet];
  if (![t hasPrefix:@"include"]) return nil;
  t = [[t substringFromIndex:7] stringByTrimmingCharactersInSet:NSCharacterSet.whitespaceCharacterSet];
  if (![t hasPrefix:@"\""]) return nil;
  NSRange close = [t rangeOfString:@"\"" options:NSLiteralSearch range:NSMakeRange(1, t.length - 1)];
  if (close.location == NSNotFound) return nil;
  return [t substringWithRange:NSMakeRange(1, close.location - 1)];
}

// Appends `file` (relative to `dir`) to `out` with its local includes inlined
// where they stand, as the preprocessor would include them (so conditional
// includes keep working). A file with `#pragma once` is wrapped in an include
// guard instead. Returns NO with *problem set when a file cannot be read.
static BOOL expand_file(NSString *dir, NSString *file, int depth, NSMutableString *out, NSString **original,
                        NSString **problem) {
  if (depth > 16) {
    *problem = [NSString stringWithFormat:@"%@: includes nested more than 16 deep (an include cycle?)", file];
    return NO;
  }
  NSError *error = nil;
  NSString *path = [dir stringByAppendingPathComponent:file];
  NSString *text = [NSString stringWithContentsOfFile:path encoding:NSUTF8StringEncoding error:&error];
  if (!text) {
    *problem = [NSString stringWithFormat:@"cannot read %@: %@", path, error.localizedDescription];
    return NO;
  }
  if (original) *original = text;
  NSArray<NSString *> *lines = [text componentsSeparatedByString:@"\n"];
  BOOL once = NO;
  for (NSString *line in lines)
    if ([[line stringByTrimmingCharactersInSet:NSCharacterSet.whitespaceCharacterSet] hasPrefix:@"#pragma once"]) once = YES;
  NSString *guard = nil;
  if (once) {
    NSMutableString *g = [NSMutableString stringWithString:@"CK_INLINED_"];
    for (NSUInteger i = 0; i < file.length; i++) {
      unichar c = [file characterAtIndex:i];
      BOOL word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      [g appendFormat:@"%c", word ? (char)c : '_'];
    }
    guard = g;
    [out appendFormat:@"#ifndef %@\n#define %@\n", guard, guard];
  }
  [out appendFormat:@"#line 1 \"%@\"\n", file];
  for (NSUInteger i = 0; i < lines.count; i++) {
    NSString *line = lines[i];
    NSString *trimmed = [line stringByTrimmingCharactersInSet:NSCharacterSet.whitespaceCharacterSet];
    if ([trimmed hasPrefix:@"#pragma once"]) {
      [out appendString:@"\n"];
      continue;
    }
    NSString *include = quoted_include(line);
    if (include && [NSFileManager.defaultManager fileExistsAtPath:[dir stringByAppendingPathComponent:include]]) {
      if (!expand_file(dir, include, depth + 1, out, NULL, problem)) return NO;
      [out appendFormat:@"#line %lu \"%@\"\n", (unsigned long)(i + 2), file];
      continue;
    }
    [out appendString:line];
    [out appendString:@"\n"];
  }
  if (guard) [out appendFormat:@"#endif  // %@\n", guard];
  return YES;
}

static BOOL is_ident_char(unichar c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Does `line` declare the kernel `name` (the word followed by '(' on a line
// that says `kernel`)?
static BOOL declares_kernel(NSString *line, NSString *name) {
  if ([line rangeOfString:@"kernel"].location == NSNotFound) return NO;
  NSRange search = NSMakeRange(0, line.length);
  for (;;) {
    NSRange r = [line rangeOfString:name options:NSLiteralSearch range:search];
    if (r.location == NSNotFound) return NO;
    NSUInteger end = r.location + r.length;
    BOOL word_start = r.location == 0 || !is_ident_char([line characterAtIndex:r.location - 1]);
    NSUInteger j = end;
    while (j < line.length && [line characterAtIndex:j] == ' ') j++;
    if (word_start && j < line.length && [line characterAtIndex:j] == '(') return YES;
    search = NSMakeRange(end, line.length - end);
  }
}

// ":line" of the kernel's [[host_name]] or signature in its file, or "".
static NSString *line_suffix(NSString *text, NSString *name) {
  NSArray<NSString *> *lines = [text componentsSeparatedByString:@"\n"];
  NSString *host = [NSString stringWithFormat:@"host_name(\"%@\")", name];
  for (NSUInteger i = 0; i < lines.count; i++)
    if ([lines[i] rangeOfString:host].location != NSNotFound) return [NSString stringWithFormat:@":%lu", (unsigned long)(i + 1)];
  for (NSUInteger i = 0; i < lines.count; i++)
    if (declares_kernel(lines[i], name)) return [NSString stringWithFormat:@":%lu", (unsigned long)(i + 1)];
  return @"";
}

// No fast math, whatever SDK built the library. fastMathEnabled = NO covers arithmetic on
// every macOS. From macOS 15 the floating-point functions (exp, log, ...) are a second
// setting whose default is Fast whatever fastMathEnabled says, so a library built with the
// macOS 14 SDK (which does not declare it) and run on macOS 15 would get fast exp: there the
// properties exist at run time and are set by name (KVC; the values are the macOS 15 SDK's
// MTLMathModeSafe = 0 and MTLMathFloatingPointFunctionsPrecise = 1).
static void set_precise_math(MTLCompileOptions *options) {
#if CK_SDK_HAS_MACOS15
  if (@available(macOS 15.0, *)) {
    options.mathMode = MTLMathModeSafe;
    options.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
    return;
  }
#endif
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"  // deprecated only from the macOS 15 SDK
  options.fastMathEnabled = NO;
#pragma clang diagnostic pop
#if !CK_SDK_HAS_MACOS15
  if (@available(macOS 15.0, *)) {
    if ([options respondsToSelector:NSSelectorFromString(@"setMathFloatingPointFunctions:")]) {
      [options setValue:[NSNumber numberWithInteger:0] forKey:@"mathMode"];
      [options setValue:[NSNumber numberWithInteger:1] forKey:@"mathFloatingPointFunctions"];
    }
  }
#endif
}

// CHERENKOV_METAL_DEBUG=1: build pipelines with reflection (the binding checks of
// ck_encode_dispatch), record encoder execution status and a signpost per dispatch (a GPU
// fault then names its kernel). Off by default: each costs start-up or encode time.
BOOL ck_metal_debug(void) {
  static BOOL on;
  static dispatch_once_t once;
  dispatch_once(&once, ^{
    NSString *flag = NSProcessInfo.processInfo.environment[@"CHERENKOV_METAL_DEBUG"];
    on = flag != nil && [flag isEqualToString:@"1"];
  });
  return on;
}

static NSLock *cache_lock;
static NSMutableDictionary<NSString *, id<MTLLibrary>> *cached_libraries;
static NSMutableDictionary<NSString *, CherenkovPipeline *> *cached_pipelines;

static void init_caches(void) {
  static dispatch_once_t once;
  dispatch_once(&once, ^{
    cache_lock = [NSLock new];
    cached_libraries = [NSMutableDictionary dictionary];
    cached_pipelines = [NSMutableDictionary dictionary];
  });
}

static MTLCompileOptions *compile_options(void) {
  MTLCompileOptions *options = [MTLCompileOptions new];
  // MSL 3.1 (macOS 14) is the first with bfloat. Fast math is off: kernels use infinities
  // (softmax and top-k initial values), which fast math may assume away, the CPU backend is
  // precise too, and the kernel tests hold exp/log to 1e-6 relative.
  options.languageVersion = MTLLanguageVersion3_1;
  set_precise_math(options);
  return options;
}

// The compiled library of each source, from the process's cache or compiled now: every
// source not cached is handed to Metal's asynchronous compiler at once, so the files compile
// in parallel (one after another they made the first load wait for the sum). On failure
// returns nil with *problem naming the first file (in `files` order) that did not compile.
static NSArray<id<MTLLibrary>> *libraries_for(CherenkovDevice *d, NSArray<NSString *> *sources, NSArray<NSString *> *files,
                                              NSString **problem) {
  init_caches();
  NSUInteger n = sources.count;
  NSMutableArray *out = [NSMutableArray arrayWithCapacity:n];
  NSMutableArray *errors = [NSMutableArray arrayWithCapacity:n];
  NSCondition *done = [NSCondition new];
  __block NSUInteger pending = 0;
  MTLCompileOptions *options = compile_options();
  // Every slot is filled before any compile starts: the handlers only replace slots, under `done`.
  for (NSUInteger i = 0; i < n; i++) {
    [cache_lock lock];
    id<MTLLibrary> lib = cached_libraries[sources[i]];
    [cache_lock unlock];
    [errors addObject:[NSNull null]];
    if (lib && lib.device == d->mtl) [out addObject:lib];
    else {
      [out addObject:[NSNull null]];
      pending++;
    }
  }
  for (NSUInteger i = 0; i < n; i++) {
    if (![out[i] isKindOfClass:[NSNull class]]) continue;
    [d->mtl newLibraryWithSource:sources[i]
                         options:options
               completionHandler:^(id<MTLLibrary> compiled, NSError *error) {
                 [done lock];
                 if (compiled) out[i] = compiled;
                 else errors[i] = error ? error.localizedDescription : @"the compiler gave no reason";
                 pending--;
                 [done broadcast];
                 [done unlock];
               }];
  }
  [done lock];
  while (pending > 0) [done wait];
  [done unlock];
  for (NSUInteger i = 0; i < n; i++) {
    if ([out[i] isKindOfClass:[NSNull class]]) {
      *problem = [NSString stringWithFormat:@"%@ does not compile:\n%@", files[i], errors[i]];
      return nil;
    }
    [cache_lock lock];
    // Kept for the process's life (pipeline keys hold its address); another GPU's copy stays.
    if (!cached_libraries[sources[i]]) cached_libraries[sources[i]] = out[i];
    [cache_lock unlock];
  }
  return out;
}

// FNV-1a, 64 bits: names an archive after the exact sources it was built from (a changed
// kernel gets a new file; the archive only saves compile time, Metal checks what it loads).
static uint64_t fnv1a(uint64_t h, NSString *text) {
  const char *bytes = text.UTF8String;
  for (const char *c = bytes ? bytes : ""; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  return h;
}

// The pipeline archive of these sources on this device: opened from the cache directory
// ($CHERENKOV_METAL_CACHE, else ~/Library/Caches/cherenkov) when a previous run wrote it,
// else empty. A file Metal cannot read is replaced at the next write.
static void open_archive(CherenkovLibrary *l, NSArray<NSString *> *sources) {
  NSDictionary<NSString *, NSString *> *env = NSProcessInfo.processInfo.environment;
  NSString *flag = env[@"CHERENKOV_METAL_ARCHIVE"];
  if (flag && [flag isEqualToString:@"0"]) return;
  uint64_t h = fnv1a(14695981039346656037ull, l->dev->mtl.name);
  h = fnv1a(h, @"msl3.1 precise");  // the compile options
  for (NSString *source in sources) h = fnv1a(h, source);
  NSString *dir = env[@"CHERENKOV_METAL_CACHE"];
  if (!dir) dir = [NSHomeDirectory() stringByAppendingPathComponent:@"Library/Caches/cherenkov"];
  NSString *path = [dir stringByAppendingPathComponent:[NSString stringWithFormat:@"pipelines-%016llx.metallib", (unsigned long long)h]];
  MTLBinaryArchiveDescriptor *desc = [MTLBinaryArchiveDescriptor new];
  NSError *error = nil;
  if ([NSFileManager.defaultManager fileExistsAtPath:path]) {
    desc.url = [NSURL fileURLWithPath:path];
    l->archive = [l->dev->mtl newBinaryArchiveWithDescriptor:desc error:&error];
  }
  if (!l->archive) {
    desc.url = nil;
    l->archive = [l->dev->mtl newBinaryArchiveWithDescriptor:desc error:&error];
  }
  l->archive_url = [NSURL fileURLWithPath:path];
  l->archive_dir = dir;
}

static NSArray<NSString *> *sorted_bytewise(NSArray<NSString *> *names) {
  return [names sortedArrayUsingComparator:^NSComparisonResult(id a, id b) {
    return [(NSString *)a compare:(NSString *)b options:NSLiteralSearch];
  }];
}

CK_API ck_library *ck_library_load(ck_device *dev, const char *dir) {
  @autoreleasepool {
    if (!dev) return ck_fail(@"ck_library_load: device is NULL"), NULL;
    if (!dir) return ck_fail(@"ck_library_load: dir is NULL (the Metal backend compiles the .metal files of a directory)"), NULL;
    CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
    NSString *path = [NSString stringWithUTF8String:dir];
    if (!path) return ck_fail(@"ck_library_load: the directory name is not UTF-8"), NULL;
    NSError *error = nil;
    NSArray<NSString *> *entries = [NSFileManager.defaultManager contentsOfDirectoryAtPath:path error:&error];
    if (!entries) return ck_fail(@"ck_library_load: cannot list %@: %@", path, error.localizedDescription), NULL;
    NSMutableArray<NSString *> *files = [NSMutableArray array];
    for (NSString *entry in entries)
      if ([entry hasSuffix:@".metal"]) [files addObject:entry];
    if (files.count == 0) return ck_fail(@"ck_library_load: %@ has no .metal files", path), NULL;

    NSString *shown = path.lastPathComponent;
    NSMutableDictionary<NSString *, id<MTLFunction>> *functions = [NSMutableDictionary dictionary];
    NSMutableDictionary<NSString *, NSString *> *where = [NSMutableDictionary dictionary];
    NSMutableDictionary<NSString *, NSString *> *file_of = [NSMutableDictionary dictionary];
    NSMutableDictionary<NSString *, id<MTLLibrary>> *library_of = [NSMutableDictionary dictionary];
    NSArray<NSString *> *ordered = sorted_bytewise(files);
    NSMutableArray<NSString *> *sources = [NSMutableArray arrayWithCapacity:ordered.count];
    NSMutableArray<NSString *> *originals = [NSMutableArray arrayWithCapacity:ordered.count];
    NSMutableArray<NSString *> *shown_files = [NSMutableArray arrayWithCapacity:ordered.count];
    for (NSString *file in ordered) {
      NSMutableString *source = [NSMutableString string];
      NSString *original = nil, *problem = nil;
      if (!expand_file(path, file, 0, source, &original, &problem))
        return ck_fail(@"ck_library_load: %@", problem), NULL;
      [sources addObject:source];
      [originals addObject:original];
      [shown_files addObject:[NSString stringWithFormat:@"%@/%@", shown, file]];
    }
    NSString *problem = nil;
    NSArray<id<MTLLibrary>> *libraries = libraries_for(d, sources, shown_files, &problem);
    if (!libraries) return ck_fail(@"ck_library_load: %@", problem), NULL;
    for (NSUInteger f = 0; f < ordered.count; f++) {
      NSString *file = ordered[f], *original = originals[f];
      id<MTLLibrary> lib = libraries[f];
      for (NSString *name in lib.functionNames) {
        id<MTLFunction> fn = [lib newFunctionWithName:name];
        if (!fn || fn.functionType != MTLFunctionTypeKernel) continue;
        if (functions[name])
          return ck_fail(@"ck_library_load: kernel %@ is defined in both %@/%@ and %@/%@", name, shown, file_of[name],
                         shown, file), NULL;
        functions[name] = fn;
        file_of[name] = file;
        library_of[name] = lib;
        where[name] = [NSString stringWithFormat:@"%@/%@%@", shown, file, line_suffix(original, name)];
      }
    }

    CherenkovLibrary *l = [CherenkovLibrary new];
    l->dev = d;
    l->dir = path;
    l->names = sorted_bytewise(functions.allKeys);
    NSMutableArray<NSData *> *names_c = [NSMutableArray arrayWithCapacity:l->names.count];
    for (NSString *name in l->names) [names_c addObject:ck_cstring(name)];
    l->names_c = names_c;
    l->functions = functions;
    l->where = where;
    l->library_of = library_of;
    l->pipelines = [NSMutableDictionary dictionary];
    l->lock = [NSLock new];
    open_archive(l, sources);
    return CK_HANDLE(ck_library, l);
  }
}

CK_API void ck_library_release(ck_library *lib) {
  @autoreleasepool {
    CherenkovLibrary *l = lib ? CK_OBJ(CherenkovLibrary, lib) : nil;
    if (l) {
      [l->lock lock];
      if (l->archive && l->archive_dirty) {
        // Best effort: a cache that cannot be written costs the next run its compile time only.
        [NSFileManager.defaultManager createDirectoryAtPath:l->archive_dir withIntermediateDirectories:YES attributes:nil error:nil];
        [l->archive serializeToURL:l->archive_url error:nil];
        l->archive_dirty = NO;
      }
      [l->lock unlock];
    }
    ck_drop_handle(lib);
  }
}

CK_API uint32_t ck_library_kernel_count(ck_library *lib) {
  return lib ? (uint32_t)CK_OBJ(CherenkovLibrary, lib)->names.count : 0;
}

CK_API const char *ck_library_kernel_name(ck_library *lib, uint32_t index) {
  if (!lib || index >= CK_OBJ(CherenkovLibrary, lib)->names_c.count) return "";
  return (const char *)CK_OBJ(CherenkovLibrary, lib)->names_c[index].bytes;
}

// Builds the pipeline of `name` and reads its buffer arguments from Metal's
// reflection, for the checks ck_encode_dispatch makes. Called with l->lock held.
static CherenkovPipeline *build_pipeline(CherenkovLibrary *l, NSString *name, const char *raw_name) {
  id<MTLFunction> fn = name ? l->functions[name] : nil;
  if (!fn) {
    ck_fail(@"pipeline not found: %s (the metal library has %lu kernels, compiled from %@)", raw_name,
            (unsigned long)l->names.count, l->dir);
    return nil;
  }
  NSString *where = l->where[name];
  MTLAutoreleasedComputePipelineReflection reflection = nil;
  NSError *error = nil;
  // Reflection (the binding checks) only under CHERENKOV_METAL_DEBUG=1: it slows every
  // pipeline's creation, and Metal's validation layer checks bindings when asked anyway.
  // Through the library's archive: a pipeline a previous run built is loaded, not compiled.
  MTLComputePipelineDescriptor *desc = [MTLComputePipelineDescriptor new];
  desc.computeFunction = fn;
  desc.label = name;
  if (l->archive) desc.binaryArchives = [NSArray arrayWithObject:l->archive];
  id<MTLComputePipelineState> state =
      ck_metal_debug() ? [l->dev->mtl newComputePipelineStateWithDescriptor:desc
                                                                    options:MTLPipelineOptionBindingInfo | MTLPipelineOptionBufferTypeInfo
                                                                 reflection:&reflection
                                                                      error:&error]
                       : [l->dev->mtl newComputePipelineStateWithDescriptor:desc options:MTLPipelineOptionNone reflection:nil error:&error];
  if (state && l->archive && [l->archive addComputePipelineFunctionsWithDescriptor:desc error:nil]) l->archive_dirty = YES;
  if (!state) {
    ck_fail(@"ck_pipeline_get: %@ (%@): Metal could not build its pipeline: %@", name, where,
            error ? error.localizedDescription : @"no reason given");
    return nil;
  }
  CherenkovPipeline *p = [CherenkovPipeline new];
  p->state = state;
  p->name = name;
  p->name_c = ck_cstring(name);
  p->where = where;
  p->signpost = [NSString stringWithFormat:@"%@ (%@)", name, where];
  p->max_threads = (uint32_t)state.maxTotalThreadsPerThreadgroup;
  if (!reflection) {
    // Without reflection nothing is known about the arguments: accept every
    // binding rather than reject valid dispatches (Metal then validates).
    p->buffer_mask = p->used_mask = 0;
    p->checked = NO;
    return p;
  }
  p->checked = YES;
  for (id<MTLBinding> b in reflection.bindings) {
    if (b.type == MTLBindingTypeThreadgroupMemory) {
      // cherenkov.h has no call to size threadgroup arguments: declare
      // threadgroup arrays inside the kernel instead.
      ck_fail(@"ck_pipeline_get: %@ (%@): argument %@ is [[threadgroup(%lu)]] memory, which cherenkov.h cannot size",
              name, where, b.name, (unsigned long)b.index);
      return nil;
    }
    if (b.type != MTLBindingTypeBuffer) continue;
    if (b.index >= CK_MAX_BUFFER_BINDINGS) {
      ck_fail(@"ck_pipeline_get: %@ (%@): argument %@ is [[buffer(%lu)]]; cherenkov.h binds indices 0 to %d", name,
              where, b.name, (unsigned long)b.index, CK_MAX_BUFFER_BINDINGS - 1);
      return nil;
    }
    p->buffer_mask |= 1u << b.index;
    if (b.used) p->used_mask |= 1u << b.index;
    if (b.index == 0) p->bytes0 = (uint32_t)((id<MTLBufferBinding>)b).bufferDataSize;
  }
  return p;
}

CK_API ck_pipeline *ck_pipeline_get(ck_library *lib, const char *name) {
  @autoreleasepool {
    if (!lib || !name) return ck_fail(@"ck_pipeline_get: library or name is NULL"), NULL;
    CherenkovLibrary *l = CK_OBJ(CherenkovLibrary, lib);
    NSString *key = [NSString stringWithUTF8String:name];
    [l->lock lock];
    CherenkovPipeline *p = key ? l->pipelines[key] : nil;
    if (!p && key && l->library_of[key]) {
      // Built before by another ck_library of this process from the same compiled file?
      NSString *shared = [NSString stringWithFormat:@"%p %@", (__bridge void *)l->library_of[key], key];
      [cache_lock lock];
      p = cached_pipelines[shared];
      [cache_lock unlock];
      if (!p) {
        p = build_pipeline(l, key, name);
        if (p) {
          [cache_lock lock];
          cached_pipelines[shared] = p;
          [cache_lock unlock];
        }
      }
      if (p) l->pipelines[key] = p;
    } else if (!p) {
      p = build_pipeline(l, key, name);  // fails, naming the kernel that is not there
    }
    [l->lock unlock];
    // The library keeps the pipeline; the caller borrows it.
    return p ? (ck_pipeline *)(__bridge void *)p : NULL;
  }
}

CK_API const char *ck_pipeline_name(ck_pipeline *pipe) {
  return pipe ? (const char *)CK_OBJ(CherenkovPipeline, pipe)->name_c.bytes : "";
}

CK_API uint32_t ck_pipeline_max_threads(ck_pipeline *pipe) {
  return pipe ? CK_OBJ(CherenkovPipeline, pipe)->max_threads : 0;
}
