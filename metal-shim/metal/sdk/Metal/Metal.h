/*
 * Checking stand-in for Apple's <Metal/Metal.h>, for metal-shim's Linux
 * syntax check only (see objc/NSObject.h). It declares the part of the Metal
 * API that metal-shim/metal/*.m calls: device, queue, command buffer, compute
 * encoder, buffer, library, function, compute pipeline with reflection,
 * shared event, residency set. Selectors, types, enum values and macOS
 * availability follow Apple's public SDK headers (MTLDevice.h, MTLTypes.h,
 * MTLResource.h, MTLBuffer.h, MTLLibrary.h, MTLArgument.h,
 * MTLComputePipeline.h, MTLCommandQueue.h, MTLCommandBuffer.h,
 * MTLCommandEncoder.h, MTLComputeCommandEncoder.h, MTLEvent.h,
 * MTLAllocation.h, MTLResidencySet.h). Availability matters: the check builds
 * for macOS 14 and makes any unguarded use of a newer API an error. What first
 * appeared in the macOS 15 SDK (Xcode 16) sits under
 * `#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000`, so CK_SDK_VERSION=140000 reads
 * like the macOS 14 SDK (Xcode 15), where those names do not exist at all.
 */
#pragma once
#import <Foundation/Foundation.h>

NS_ASSUME_NONNULL_BEGIN

@protocol MTLDevice;
@protocol MTLCommandQueue;
@protocol MTLCommandBuffer;

/* ---- MTLTypes.h ------------------------------------------------------------ */

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;
static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize s;
  s.width = width;
  s.height = height;
  s.depth = depth;
  return s;
}

/* ---- MTLResource.h --------------------------------------------------------- */

typedef NS_ENUM(NSUInteger, MTLCPUCacheMode) {
  MTLCPUCacheModeDefaultCache = 0,
  MTLCPUCacheModeWriteCombined = 1,
};
typedef NS_ENUM(NSUInteger, MTLStorageMode) {
  MTLStorageModeShared = 0,
  MTLStorageModeManaged = 1,
  MTLStorageModePrivate = 2,
  MTLStorageModeMemoryless = 3,
};
typedef NS_ENUM(NSUInteger, MTLHazardTrackingMode) {
  MTLHazardTrackingModeDefault = 0,
  MTLHazardTrackingModeUntracked = 1,
  MTLHazardTrackingModeTracked = 2,
};
#define MTLResourceCPUCacheModeShift 0
#define MTLResourceStorageModeShift 4
#define MTLResourceHazardTrackingModeShift 8
typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
  MTLResourceCPUCacheModeDefaultCache = MTLCPUCacheModeDefaultCache << MTLResourceCPUCacheModeShift,
  MTLResourceCPUCacheModeWriteCombined = MTLCPUCacheModeWriteCombined << MTLResourceCPUCacheModeShift,
  MTLResourceStorageModeShared = MTLStorageModeShared << MTLResourceStorageModeShift,
  MTLResourceStorageModeManaged = MTLStorageModeManaged << MTLResourceStorageModeShift,
  MTLResourceStorageModePrivate = MTLStorageModePrivate << MTLResourceStorageModeShift,
  MTLResourceHazardTrackingModeDefault = MTLHazardTrackingModeDefault << MTLResourceHazardTrackingModeShift,
  MTLResourceHazardTrackingModeUntracked = MTLHazardTrackingModeUntracked << MTLResourceHazardTrackingModeShift,
  MTLResourceHazardTrackingModeTracked = MTLHazardTrackingModeTracked << MTLResourceHazardTrackingModeShift,
};

/* What a compute encoder declares it will do to a resource it reaches
 * indirectly (MTLCommandEncoder.h). */
typedef NS_OPTIONS(NSUInteger, MTLResourceUsage) {
  MTLResourceUsageRead = 1 << 0,
  MTLResourceUsageWrite = 1 << 1,
};

/* MTLAllocation.h (macOS 15 SDK): anything a residency set can hold. */
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
CK_SDK_MACOS(15.0)
@protocol MTLAllocation <NSObject>
@property (readonly) NSUInteger allocatedSize CK_SDK_MACOS(15.0);
@end
#define CK_RESOURCE_BASE MTLAllocation
#else
#define CK_RESOURCE_BASE NSObject
#endif

@protocol MTLResource <CK_RESOURCE_BASE>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
@property (readonly) MTLStorageMode storageMode;
@end

/* ---- MTLBuffer.h ----------------------------------------------------------- */

@protocol MTLBuffer <MTLResource>
@property (readonly) NSUInteger length;
- (void *)contents NS_RETURNS_INNER_POINTER;
@end

/* ---- MTLLibrary.h ---------------------------------------------------------- */

typedef NS_ENUM(NSUInteger, MTLFunctionType) {
  MTLFunctionTypeVertex = 1,
  MTLFunctionTypeFragment = 2,
  MTLFunctionTypeKernel = 3,
  MTLFunctionTypeVisible CK_SDK_MACOS(11.0) = 5,
  MTLFunctionTypeIntersection CK_SDK_MACOS(11.0) = 6,
};

typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
  MTLLanguageVersion2_4 CK_SDK_MACOS(12.0) = (2 << 16) + 4,
  MTLLanguageVersion3_0 CK_SDK_MACOS(13.0) = (3 << 16) + 0,
  MTLLanguageVersion3_1 CK_SDK_MACOS(14.0) = (3 << 16) + 1,
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
  MTLLanguageVersion3_2 CK_SDK_MACOS(15.0) = (3 << 16) + 2,
#endif
};

@protocol MTLFunction <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
@property (readonly) MTLFunctionType functionType;
@property (readonly) NSString *name;
@end

#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
/* How freely the compiler may rewrite floating-point math (macOS 15 SDK). */
typedef NS_ENUM(NSInteger, MTLMathMode) {
  MTLMathModeSafe = 0,
  MTLMathModeRelaxed = 1,
  MTLMathModeFast = 2,
} CK_SDK_MACOS(15.0);

/* Which FP32 math functions (exp, log, ...) the library uses (macOS 15 SDK);
 * Fast is the default there, whatever mathMode says. */
typedef NS_ENUM(NSInteger, MTLMathFloatingPointFunctions) {
  MTLMathFloatingPointFunctionsFast = 0,
  MTLMathFloatingPointFunctionsPrecise = 1,
} CK_SDK_MACOS(15.0);
#endif

@interface MTLCompileOptions : NSObject <NSCopying>
@property (nullable, readwrite, copy, nonatomic) NSDictionary<NSString *, NSObject *> *preprocessorMacros;
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
/* Deprecated in the macOS 15 SDK in favour of mathMode. */
@property (readwrite, nonatomic) BOOL fastMathEnabled CK_SDK_MACOS_DEPRECATED(10.11, 15.0);
@property (readwrite, nonatomic) MTLMathMode mathMode CK_SDK_MACOS(15.0);
@property (readwrite, nonatomic) MTLMathFloatingPointFunctions mathFloatingPointFunctions CK_SDK_MACOS(15.0);
#else
@property (readwrite, nonatomic) BOOL fastMathEnabled CK_SDK_MACOS(10.11);
#endif
@property (readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLLibrary <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
- (nullable id<MTLFunction>)newFunctionWithName:(NSString *)functionName;
@property (readonly) NSArray<NSString *> *functionNames;
@end

/* ---- MTLArgument.h (bindings, macOS 13) ----------------------------------- */

typedef NS_ENUM(NSInteger, MTLBindingType) {
  MTLBindingTypeBuffer = 0,
  MTLBindingTypeThreadgroupMemory = 1,
  MTLBindingTypeTexture = 2,
  MTLBindingTypeSampler = 3,
} CK_SDK_MACOS(13.0);

typedef NS_ENUM(NSUInteger, MTLBindingAccess) {
  MTLBindingAccessReadOnly = 0,
  MTLBindingAccessReadWrite = 1,
  MTLBindingAccessWriteOnly = 2,
} CK_SDK_MACOS(13.0);

CK_SDK_MACOS(13.0)
@protocol MTLBinding <NSObject>
@property (readonly) NSString *name;
@property (readonly) MTLBindingType type;
@property (readonly) MTLBindingAccess access;
@property (readonly) NSUInteger index;
@property (readonly, getter=isUsed) BOOL used;
@property (readonly, getter=isArgument) BOOL argument;
@end

CK_SDK_MACOS(13.0)
@protocol MTLBufferBinding <MTLBinding>
@property (readonly) NSUInteger bufferAlignment;
@property (readonly) NSUInteger bufferDataSize;
@end

/* ---- MTLComputePipeline.h / MTLDevice.h (pipelines) ----------------------- */

typedef NS_OPTIONS(NSUInteger, MTLPipelineOption) {
  MTLPipelineOptionNone = 0,
  MTLPipelineOptionArgumentInfo CK_SDK_MACOS_DEPRECATED(10.11, 13.0) = 1 << 0,
  MTLPipelineOptionBindingInfo CK_SDK_MACOS(13.0) = 1 << 0,
  MTLPipelineOptionBufferTypeInfo = 1 << 1,
};

@interface MTLComputePipelineReflection : NSObject
@property (nonnull, readonly) NSArray<id<MTLBinding>> *bindings CK_SDK_MACOS(13.0);
@end
typedef __autoreleasing MTLComputePipelineReflection *_Nullable MTLAutoreleasedComputePipelineReflection;

@protocol MTLComputePipelineState <NSObject>
@property (nullable, readonly) NSString *label;
@property (readonly) id<MTLDevice> device;
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property (readonly) NSUInteger threadExecutionWidth;
@property (readonly) NSUInteger staticThreadgroupMemoryLength;
@end

/* ---- MTLComputePipeline.h (descriptor) / MTLBinaryArchive.h (macOS 11) ------ */

@protocol MTLBinaryArchive;

@interface MTLComputePipelineDescriptor : NSObject <NSCopying>
@property (nullable, copy, nonatomic) NSString *label;
@property (nullable, readwrite, nonatomic, strong) id<MTLFunction> computeFunction;
@property (readwrite, nullable, nonatomic, copy) NSArray<id<MTLBinaryArchive>> *binaryArchives CK_SDK_MACOS(11.0);
@end

CK_SDK_MACOS(11.0)
@interface MTLBinaryArchiveDescriptor : NSObject <NSCopying>
/* The file to open, or nil for an empty archive. */
@property (readwrite, nullable, nonatomic, copy) NSURL *url;
@end

CK_SDK_MACOS(11.0)
@protocol MTLBinaryArchive <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
- (BOOL)addComputePipelineFunctionsWithDescriptor:(MTLComputePipelineDescriptor *)descriptor error:(NSError **)error;
- (BOOL)serializeToURL:(NSURL *)url error:(NSError **)error;
@end

/* ---- MTLEvent.h -------------------------------------------------------------- */

@protocol MTLEvent <NSObject>
@property (nullable, readonly) id<MTLDevice> device;
@property (nullable, copy, atomic) NSString *label;
@end

/* An event whose value the CPU can read, set and wait for. */
@protocol MTLSharedEvent <MTLEvent>
@property (readwrite) uint64_t signaledValue;
/* YES when the value reached `value` within the timeout. */
- (BOOL)waitUntilSignaledValue:(uint64_t)value timeoutMS:(uint64_t)milliseconds CK_SDK_MACOS(12.0);
@end

/* ---- MTLResidencySet.h (macOS 15 SDK) -------------------------------------- */
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000

CK_SDK_MACOS(15.0)
@interface MTLResidencySetDescriptor : NSObject <NSCopying>
@property (nullable, copy, nonatomic) NSString *label;
@property (nonatomic) NSUInteger initialCapacity;
@end

/* Allocations added or removed take effect at the next commit. */
CK_SDK_MACOS(15.0)
@protocol MTLResidencySet <NSObject>
@property (readonly) id<MTLDevice> device;
@property (readonly, nullable) NSString *label;
@property (readonly) uint64_t allocatedSize;
- (void)requestResidency;
- (void)endResidency;
- (void)addAllocation:(id<MTLAllocation>)allocation;
- (void)removeAllocation:(id<MTLAllocation>)allocation;
- (void)removeAllAllocations;
- (BOOL)containsAllocation:(id<MTLAllocation>)anAllocation;
@property (readonly) NSUInteger allocationCount;
- (void)commit;
@end
#endif

/* ---- MTLCommandEncoder.h / MTLComputeCommandEncoder.h -------------------------- */

typedef NS_ENUM(NSUInteger, MTLDispatchType) {
  MTLDispatchTypeSerial,
  MTLDispatchTypeConcurrent,
};

@protocol MTLCommandEncoder <NSObject>
@property (readonly) id<MTLDevice> device;
@property (nullable, copy, atomic) NSString *label;
- (void)endEncoding;
/* A marker recorded in the command stream (listed by MTLCommandBufferEncoderInfo). */
- (void)insertDebugSignpost:(NSString *)string;
- (void)pushDebugGroup:(NSString *)string;
- (void)popDebugGroup;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
@property (readonly) MTLDispatchType dispatchType;
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
/* Threadgroup counts read by the GPU when the dispatch runs: three uint32_t
 * (MTLDispatchThreadgroupsIndirectArguments) at a 4-byte aligned offset. */
- (void)dispatchThreadgroupsWithIndirectBuffer:(id<MTLBuffer>)indirectBuffer
                          indirectBufferOffset:(NSUInteger)indirectBufferOffset
                         threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)useResource:(id<MTLResource>)resource usage:(MTLResourceUsage)usage;
@end

/* ---- MTLCommandBuffer.h -------------------------------------------------------- */

typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
  MTLCommandBufferStatusNotEnqueued = 0,
  MTLCommandBufferStatusEnqueued = 1,
  MTLCommandBufferStatusCommitted = 2,
  MTLCommandBufferStatusScheduled = 3,
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5,
};

/* Per-encoder execution status in a failed command buffer's error (macOS 11): the
 * NSError's userInfo holds, under MTLCommandBufferEncoderInfoErrorKey, one
 * MTLCommandBufferEncoderInfo per encoder in recorded order, when the command buffer was
 * made with MTLCommandBufferErrorOptionEncoderExecutionStatus. */
extern NSErrorUserInfoKey const MTLCommandBufferEncoderInfoErrorKey CK_SDK_MACOS(11.0);

typedef NS_OPTIONS(NSUInteger, MTLCommandBufferErrorOption) {
  MTLCommandBufferErrorOptionNone = 0,
  MTLCommandBufferErrorOptionEncoderExecutionStatus = 1 << 0,
} CK_SDK_MACOS(11.0);

typedef NS_ENUM(NSInteger, MTLCommandEncoderErrorState) {
  MTLCommandEncoderErrorStateUnknown = 0,
  MTLCommandEncoderErrorStateCompleted = 1,
  MTLCommandEncoderErrorStateAffected = 2,
  MTLCommandEncoderErrorStatePending = 3,
  MTLCommandEncoderErrorStateFaulted = 4,
} CK_SDK_MACOS(11.0);

CK_SDK_MACOS(11.0)
@interface MTLCommandBufferDescriptor : NSObject <NSCopying>
@property (readwrite, nonatomic) BOOL retainedReferences;
@property (readwrite, nonatomic) MTLCommandBufferErrorOption errorOptions;
@end

CK_SDK_MACOS(11.0)
@protocol MTLCommandBufferEncoderInfo <NSObject>
@property (readonly, nonatomic) NSString *label;
@property (readonly, nonatomic) NSArray<NSString *> *debugSignposts;
@property (readonly, nonatomic) MTLCommandEncoderErrorState errorState;
@end

typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

@protocol MTLCommandBuffer <NSObject>
@property (readonly) id<MTLDevice> device;
@property (readonly) id<MTLCommandQueue> commandQueue;
@property (nullable, copy, atomic) NSString *label;
@property (readonly) MTLCommandBufferStatus status;
@property (nullable, readonly) NSError *error;
- (void)enqueue;
- (void)commit;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (void)waitUntilCompleted;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)dispatchType;
/* Both may only be encoded while no encoder of this command buffer is open. */
- (void)encodeWaitForEvent:(id<MTLEvent>)event value:(uint64_t)value;
- (void)encodeSignalEvent:(id<MTLEvent>)event value:(uint64_t)value;
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
- (void)useResidencySet:(id<MTLResidencySet>)residencySet CK_SDK_MACOS(15.0);
#endif
@end

/* ---- MTLCommandQueue.h ---------------------------------------------------------- */

@protocol MTLCommandQueue <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
- (nullable id<MTLCommandBuffer>)commandBuffer;
- (nullable id<MTLCommandBuffer>)commandBufferWithUnretainedReferences;
- (nullable id<MTLCommandBuffer>)commandBufferWithDescriptor:(MTLCommandBufferDescriptor *)descriptor CK_SDK_MACOS(11.0);
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
/* Residency sets added here are resident for every command buffer of the queue. */
- (void)addResidencySet:(id<MTLResidencySet>)residencySet CK_SDK_MACOS(15.0);
- (void)removeResidencySet:(id<MTLResidencySet>)residencySet CK_SDK_MACOS(15.0);
#endif
@end

/* ---- MTLDevice.h ---------------------------------------------------------------- */

typedef void (^MTLNewLibraryCompletionHandler)(id<MTLLibrary> _Nullable library, NSError *_Nullable error);

@protocol MTLDevice <NSObject>
@property (readonly) NSString *name;
@property (readonly) MTLSize maxThreadsPerThreadgroup;
@property (readonly) NSUInteger maxThreadgroupMemoryLength;
@property (readonly) BOOL hasUnifiedMemory;
@property (readonly) uint64_t recommendedMaxWorkingSetSize;
@property (readonly) NSUInteger currentAllocatedSize;
@property (readonly) NSUInteger maxBufferLength;
- (nullable id<MTLCommandQueue>)newCommandQueue;
- (nullable id<MTLCommandQueue>)newCommandQueueWithMaxCommandBufferCount:(NSUInteger)maxCommandBufferCount;
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer
                                            length:(NSUInteger)length
                                           options:(MTLResourceOptions)options
                                       deallocator:(void (^_Nullable)(void *pointer, NSUInteger length))deallocator;
- (nullable id<MTLLibrary>)newLibraryWithSource:(NSString *)source
                                        options:(nullable MTLCompileOptions *)options
                                          error:(__autoreleasing NSError **)error;
/* Compiles asynchronously: the handler runs on a thread of Metal's when the library is ready. */
- (void)newLibraryWithSource:(NSString *)source
                     options:(nullable MTLCompileOptions *)options
           completionHandler:(MTLNewLibraryCompletionHandler)completionHandler;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                                      error:(__autoreleasing NSError **)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                                    options:(MTLPipelineOption)options
                                                                 reflection:(MTLAutoreleasedComputePipelineReflection *_Nullable)reflection
                                                                      error:(__autoreleasing NSError **)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithDescriptor:(MTLComputePipelineDescriptor *)descriptor
                                                                      options:(MTLPipelineOption)options
                                                                   reflection:(MTLAutoreleasedComputePipelineReflection *_Nullable)reflection
                                                                        error:(__autoreleasing NSError **)error;
- (nullable id<MTLBinaryArchive>)newBinaryArchiveWithDescriptor:(MTLBinaryArchiveDescriptor *)descriptor
                                                          error:(NSError **)error CK_SDK_MACOS(11.0);
- (nullable id<MTLSharedEvent>)newSharedEvent;
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
- (nullable id<MTLResidencySet>)newResidencySetWithDescriptor:(MTLResidencySetDescriptor *)desc
                                                        error:(NSError **)error CK_SDK_MACOS(15.0);
#endif
@end

/* The system's default GPU (returned retained). */
extern id<MTLDevice> _Nullable MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;

NS_ASSUME_NONNULL_END
